// nanscope-report --follow: a run's events as its writer commits them, and
// each documented end: a `stop` event, the writer closing the file,
// --until-idle (a killed writer), Ctrl-C. The writers are child processes, as
// a trainer would be.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "../viewer/synthetic_files.hpp"
#include "report_support.hpp"

using namespace nanscope;
using test::has_line;
using test::report_tool;
using test::TempDir;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Waits until the file at `path` holds `text` (what a tool run with its
// output there printed): the event a test waits for, not a guess of how long
// the tool takes to start. The bound is reached only by a hang.
bool wait_for_output(const std::string& path, const std::string& text) {
  const Clock::time_point start = Clock::now();
  while (seconds_since(start) < 120) {
    std::ifstream in(path);
    const std::string seen((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (seen.find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A writer in a child process. `write` runs there; the child then exits
// without closing anything it left open (as a killed trainer would), unless
// `write` closed it. ready() returns once `write` called signal_ready().
class ChildWriter {
 public:
  template <typename Write>
  explicit ChildWriter(Write write) {
    if (pipe(ready_) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      close(ready_[0]);
      write([this] {
        char c = 'x';
        (void)!::write(ready_[1], &c, 1);
      });
      _exit(0);
    }
    close(ready_[1]);
  }
  ~ChildWriter() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(ready_[0]);
  }
  void wait_ready() {
    char c;
    ASSERT_EQ(read(ready_[0], &c, 1), 1);
  }
  void wait_exit() {
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int ready_[2] = {-1, -1};
  pid_t pid_ = -1;
};

}  // namespace

TEST(ReportFollow, AFinishedRunIsPrintedAndFollowingEndsAtOnce) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  test::write_synthetic_run(run + "/run.h5", 40, 3, /*nan_step=*/12);
  const Clock::time_point start = Clock::now();
  const auto r = report_tool("--follow " + run);
  EXPECT_LT(seconds_since(start), 10.0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, run + "/run.h5: 40 rows, 1 events so far")) << r.output;
  EXPECT_TRUE(has_line(r.output, "step 12  skip  non-finite loss; step skipped")) << r.output;
  EXPECT_TRUE(has_line(r.output, "following ended: its writer closed " + run + "/run.h5")) << r.output;
  // Then the report of the run as it ended.
  EXPECT_TRUE(has_line(r.output, "  steps       40 recorded (steps 0-39): 39 counted, 1 skipped")) << r.output;

  // Each rank of a several-process run, its lines marked with its rank.
  const std::string ranks = dir.file("ranks");
  test::write_synthetic_rank_dir(ranks, 2, 30, 2, 1, 20, "1");
  const auto both = report_tool("--follow " + ranks);
  ASSERT_EQ(both.exit_code, 0) << both.output;
  EXPECT_TRUE(has_line(both.output, "rank 0  step 20  skip  non-finite grads; step skipped")) << both.output;
  EXPECT_TRUE(has_line(both.output, "rank 1  step 20  first_birth  nan at aten::log in 'blocks.1.fc' (forward)"))
      << both.output;
  EXPECT_TRUE(has_line(both.output, "following ended: rank 0  its writer closed " + ranks +
                                        "/run-rank-0.h5; rank 1  its writer closed " + ranks + "/run-rank-1.h5"))
      << both.output;
}

TEST(ReportFollow, ALiveRunIsFollowedUntilItsWriterClosesTheFile) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  ChildWriter child([&](auto signal_ready) {
    format::RunWriter writer(run + "/run.h5", test::synthetic_header(2), /*flush_every=*/4);
    for (int64_t s = 0; s < 60; ++s) {
      format::StepRow row = test::synthetic_row(s, 2, /*nan_step=*/45);
      writer.append(row);
      if (s == 20) writer.event(s, format::EventKind::warning, "grad_norm_growth: 9.1 against 1.2");
      if (s == 45) writer.event(s, format::EventKind::skip, "non-finite loss at bf16; optimizer step skipped");
      if (s == 9) {
        writer.flush();
        signal_ready();
      }
      if (s >= 10) std::this_thread::sleep_for(std::chrono::milliseconds(40));  // ~2 s of training
    }
  });  // the writer closes its file as it goes out of scope, then the child exits
  child.wait_ready();
  const Clock::time_point start = Clock::now();
  const auto r = report_tool("--follow --interval 0.3 --until-idle 30 " + run);
  const double followed = seconds_since(start);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // It followed until the writer closed its file (~2 s after it started), not less.
  EXPECT_GT(followed, 1.0) << r.output;
  const size_t warning = r.output.find("step 20  warning  grad_norm_growth: 9.1 against 1.2\n");
  const size_t skip = r.output.find("step 45  skip  non-finite loss at bf16; optimizer step skipped\n");
  const size_t ended = r.output.find("following ended: its writer closed " + run + "/run.h5\n");
  ASSERT_NE(warning, std::string::npos) << r.output;
  ASSERT_NE(skip, std::string::npos) << r.output;
  ASSERT_NE(ended, std::string::npos) << r.output;
  EXPECT_LT(warning, skip);
  EXPECT_LT(skip, ended);
  EXPECT_NE(r.output.find("progress: step "), std::string::npos) << r.output;
  EXPECT_LT(r.output.find("progress: step "), ended);
  EXPECT_TRUE(has_line(r.output, "  steps       60 recorded (steps 0-59): 59 counted, 1 skipped")) << r.output;
}

TEST(ReportFollow, AStopEventEndsFollowingWhileTheWriterStillHoldsTheFile) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  ChildWriter child([&](auto signal_ready) {
    format::RunWriter writer(run + "/run.h5", test::synthetic_header(2), 4);
    for (int64_t s = 0; s < 20; ++s) writer.append(test::synthetic_row(s, 2, 19));
    writer.event(19, format::EventKind::stop, "the weights are non-finite and no rollback is left: the run stops");
    writer.flush();
    signal_ready();
    std::this_thread::sleep_for(std::chrono::seconds(60));  // killed by the test first
  });
  child.wait_ready();
  const Clock::time_point start = Clock::now();
  const auto r = report_tool("--follow --until-idle 30 " + run);
  EXPECT_LT(seconds_since(start), 20.0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "step 19  stop  the weights are non-finite and no rollback is left: the run stops"))
      << r.output;
  EXPECT_TRUE(has_line(r.output, "following ended: the run stopped at step 19")) << r.output;
  EXPECT_TRUE(has_line(r.output, "              its writer still has it open: a live run, or one that was killed"))
      << r.output;
}

TEST(ReportFollow, AKilledWritersFileEndsFollowingAfterUntilIdle) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  ChildWriter child([&](auto) {
    auto* writer = new format::RunWriter(run + "/run.h5", test::synthetic_header(2), 1);  // never closed: "killed"
    for (int64_t s = 0; s < 10; ++s) writer->append(test::synthetic_row(s, 2));
  });
  child.wait_exit();
  const Clock::time_point start = Clock::now();
  const auto r = report_tool("--follow --until-idle 1 " + run);
  const double followed = seconds_since(start);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(followed, 1.0);
  EXPECT_LT(followed, 10.0);
  EXPECT_TRUE(has_line(r.output, "following ended: nothing new for 1 s")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  steps       10 recorded (steps 0-9): 10 counted, 0 skipped")) << r.output;
}

TEST(ReportFollow, ARunDirectoryIsWaitedForUntilItsRunFileAppears) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  // The file appears once the report says it waits for one (its output goes
  // to a file the writer reads), however long the report takes to start.
  const std::string printed = dir.file("printed");
  ChildWriter child([&](auto) {
    if (wait_for_output(printed, "waiting for a run file in ")) test::write_synthetic_run(run + "/run.h5", 30, 2, 7);
  });
  const auto r = test::run_command("sh -c '" + test::kReport + " --follow --until-idle 120 " + run + " > " + printed +
                                   " 2>&1; status=$?; cat " + printed + "; exit $status'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "waiting for a run file in " + run)) << r.output;
  EXPECT_TRUE(has_line(r.output, "step 7  skip  non-finite loss; step skipped")) << r.output;
  EXPECT_TRUE(has_line(r.output, "following ended: its writer closed " + run + "/run.h5")) << r.output;

  // A directory that stays empty is bad input once following goes idle.
  const std::string empty = dir.file("empty");
  std::filesystem::create_directories(empty);
  const auto nothing = report_tool("--follow --until-idle 0.5 " + empty);
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  EXPECT_TRUE(has_line(nothing.output, "waiting for a run file in " + empty)) << nothing.output;
  EXPECT_TRUE(has_line(nothing.output, "nanscope-report: bad input '" + empty + "': no run file appeared in 0.5 s"))
      << nothing.output;
}

TEST(ReportFollow, CtrlCEndsFollowingWithTheReportAndExit130) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  ChildWriter child([&](auto) {
    auto* writer = new format::RunWriter(run + "/run.h5", test::synthetic_header(2), 1);  // left open
    for (int64_t s = 0; s < 5; ++s) writer->append(test::synthetic_row(s, 2));
  });
  child.wait_exit();
  // No --until-idle: only Ctrl-C ends this one. It comes once the report
  // printed what it found (its Ctrl-C handling is in place before that
  // line), not after a guess of how long it takes to start.
  const std::string printed = dir.file("printed");
  const auto r = test::run_command("sh -c '" + test::kReport + " --follow " + run + " > " + printed +
                                   " 2>&1 & pid=$!; i=0; until grep -q \"events " + "so far\" " + printed +
                                   " || [ $i -ge 2400 ]; do sleep 0.05; i=$((i+1)); done; kill -INT $pid; wait $pid; " +
                                   "status=$?; cat " + printed + "; exit $status'");
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_TRUE(has_line(r.output, "following ended: interrupted")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  steps       5 recorded (steps 0-4): 5 counted, 0 skipped")) << r.output;
}
