// A C++ program that ends badly keeps its run file: the rows an uncaught
// exception or a Ctrl-C would have lost between flushes are written and the
// file is closed, as Python's exit closes it, so plain HDF5 tools open it
// (h5py.File(path) with no swmr=True). A reader clears the mark of a writer
// that died otherwise (SIGKILL).
// Each program runs in a forked child (before this process touched LibTorch's
// thread pools), and the parent reads what it left.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <csignal>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "../support/test_support.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/nanscope.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

namespace {

constexpr int kSteps = 5;  // well inside one flush (16 rows, 2 s): only an ending writes them

// The program: kSteps guarded steps with `ending` called in the last one's
// loss, then an exception nothing catches (the loop's bug after training).
// Returns the child's wait status.
template <typename Ending>
int run_program(const std::string& run_dir, Ending ending) {
  const pid_t child = fork();
  if (child == 0) {
    torch::manual_seed(0);
    torch::nn::Linear net(4, 1);
    torch::optim::SGD optimizer(net->parameters(), 0.01);
    std::ostringstream log;
    GuardOptions o{run_dir, Amp::bf16};
    o.log = &log;
    StepGuard guard(net, optimizer, o);
    for (int i = 0; i < kSteps; ++i) {
      const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
      guard.closure_step(
          [&] {
            if (i == kSteps - 1) ending();
            return torch::mse_loss(net->forward(x), y);
          },
          {x, y});
    }
    // gtest would catch it in the test body: through noexcept it is uncaught,
    // std::terminate as in a program's main.
    void (*const loop_bug)() = [] { throw std::runtime_error("the loop's bug"); };
    [&]() noexcept { loop_bug(); }();
  }
  int status = 0;
  waitpid(child, &status, 0);
  return status;
}

std::string run_file(const TempDir& dir) { return dir.file("run") + "/run.h5"; }

}  // namespace

TEST(ProgramEnding, AnUncaughtExceptionKeepsEveryRowAndClosesTheFile) {
  TempDir dir;
  const int status = run_program(dir.file("run"), [] {});
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) << "std::terminate aborts: status " << status;
  const std::string path = run_file(dir);
  EXPECT_FALSE(format::has_writer_mark(path)) << "closed as a program's end closes it";
  EXPECT_EQ(format::read_run(path).rows(), size_t(kSteps));
}

TEST(ProgramEnding, CtrlCEndsTheProgramAtTheStepsEndWithItsRowWrittenAndTheFileClosed) {
  TempDir dir;
  const int status = run_program(dir.file("run"), [] { std::raise(SIGINT); });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << "ended as Ctrl-C ends it: status " << status;
  EXPECT_FALSE(format::has_writer_mark(run_file(dir))) << "closed as Python's KeyboardInterrupt closes it";
  EXPECT_EQ(format::read_run(run_file(dir)).rows(), size_t(kSteps)) << "the interrupted step's row is in";
}

TEST(ProgramEnding, ADeadWritersMarkIsClearedByAReader) {
  // SIGKILL: no ending runs. A reader clears the mark of a writer that is gone.
  TempDir dir;
  const int status = run_program(dir.file("run"), [] { std::raise(SIGKILL); });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  const std::string path = run_file(dir);
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(format::has_writer_mark(path)) << "the writer never closed the file";
  EXPECT_TRUE(format::clear_mark_if_writer_gone(path)) << "its writer is gone";
  EXPECT_FALSE(format::has_writer_mark(path));
}

TEST(ProgramEnding, ALiveWritersMarkIsLeftAlone) {
  TempDir dir;
  torch::nn::Linear net(4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  GuardOptions o{dir.file("run"), Amp::bf16};
  o.log = &log;
  StepGuard guard(net, optimizer, o);
  const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
  guard.closure_step([&] { return torch::mse_loss(net->forward(x), y); }, {x, y});
  EXPECT_FALSE(format::clear_mark_if_writer_gone(run_file(dir))) << "this process writes it";
  EXPECT_TRUE(format::has_writer_mark(run_file(dir)));
}
