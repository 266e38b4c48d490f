#pragma once
// What every nanscope test shares: a fresh temporary directory per test, the
// built tools run as a user would (exit code and output), and a run file's
// events of one kind. Header-only; no LibTorch.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "nanscope/format/vocabulary.hpp"
#include "test_paths.hpp"

namespace nanscope::test {

// A fresh temporary directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    // Outside a test (SetUpTestSuite) there is no current test to name it after.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "suite";
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / ("nanscope-test-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs the built tools as a user would, for exit-code and output checks.
struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// The events of one kind in a run file, in order: what tests assert on.
inline std::vector<format::RunEvent> events_of(const format::RunData& run, format::EventKind kind) {
  std::vector<format::RunEvent> out;
  for (const auto& e : run.events)
    if (e.kind == kind) out.push_back(e);
  return out;
}

// "STEP: TEXT" for each event of `kind`, in order: one line to compare or print.
inline std::vector<std::string> event_lines(const format::RunData& run, format::EventKind kind) {
  std::vector<std::string> out;
  for (const auto& e : events_of(run, kind)) out.push_back(std::to_string(e.step) + ": " + e.text);
  return out;
}

// Mounts a tmpfs of `size` at `dir` and unmounts it when it goes out of scope,
// whatever the test asserted in between. mounted() is false without root.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& dir, const std::string& size)
      : dir_(dir), mounted_(::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0) {}
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

}  // namespace nanscope::test
