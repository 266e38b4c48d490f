#pragma once
// A benchmark's positional arguments, each with its default: counts, and the
// odd path. `-h`/`--help` prints the usage; a word that is not a positive
// count is an error (exit 2) rather than a run of zero rounds.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace nanscope::bench {

class Args {
 public:
  // `usage`: "NAME [ROUNDS=7] ...", the command line the benchmark takes.
  Args(int argc, char** argv, const char* usage) : argc_(argc), argv_(argv), usage_(usage) {
    for (int i = 1; i < argc; ++i)
      if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
        std::printf("usage: %s\n", usage_);
        std::exit(0);
      }
  }
  // Argument `index` (1 is the first) as a positive count; `fallback` when not given.
  long long count(int index, long long fallback) const {
    if (index >= argc_) return fallback;
    char* end = nullptr;
    const long long value = std::strtoll(argv_[index], &end, 10);
    if (end == argv_[index] || *end != '\0' || value <= 0)
      fail("'" + std::string(argv_[index]) + "' is not a positive count");
    return value;
  }
  std::string text(int index, const std::string& fallback) const { return index < argc_ ? argv_[index] : fallback; }
  // A required argument: the usage and exit 2 when it is missing.
  std::string required(int index) const {
    if (index >= argc_) fail("argument " + std::to_string(index) + " is missing");
    return argv_[index];
  }
  // Arguments the benchmark cannot run with: why, the usage, exit 2.
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s\nusage: %s\n", why.c_str(), usage_);
    std::exit(2);
  }

 private:
  int argc_;
  char** argv_;
  const char* usage_;
};

}  // namespace nanscope::bench
