#pragma once
// What every nanscope test shares: a fresh temporary directory per test, the
// built tools run as a user would (exit code and output), and a run file's
// events of one kind. Header-only; no LibTorch.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
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

// Runs `argv` (argv[0] the program) in a child under the slow-write shim
// (tests/support/slow_fwrite.c), which holds the child mid-write once it
// writes a checkpoint that replaces an earlier one and marks that moment;
// waits for the mark, then SIGKILLs the child. The kill lands mid-write,
// at the second checkpoint, every time, however busy the machine. Returns
// "" or what went wrong; `bound` is reached only by a hang (or a shim that
// does not wrap the call this HDF5 writes with).
inline std::string kill_at_second_checkpoint(const std::vector<std::string>& argv, const std::string& mark,
                                             std::chrono::seconds bound = std::chrono::seconds(120)) {
  std::filesystem::remove(mark);
  const pid_t child = fork();
  if (child == 0) {
    setenv("LD_PRELOAD", paths::slow_fwrite, 1);
    setenv("NANSCOPE_TEST_WRITING_MARK", mark.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  const auto until = std::chrono::steady_clock::now() + bound;
  bool exited = false;
  while (!std::filesystem::exists(mark) && !exited && std::chrono::steady_clock::now() < until) {
    exited = waitpid(child, nullptr, WNOHANG) == child;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (exited) return "the program exited before its second checkpoint";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (!std::filesystem::exists(mark))
    return "no checkpoint write was marked within " + std::to_string(bound.count()) +
           " s (does the slow-write shim wrap the call this HDF5 writes with?)";
  return "";
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
