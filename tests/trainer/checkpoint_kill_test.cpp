// A checkpoint is whole whenever nanscope-train is killed, even mid-write.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/models/gpt.hpp"

using namespace nanscope;

TEST(CheckpointKill, SigkillWhileOneIsWrittenAlwaysLeavesALoadableOne) {
  // nanscope-train writes a checkpoint every step on a slow disk (writes in
  // pieces, LD_PRELOAD). The shim marks the moment a checkpoint that replaces
  // an earlier one is half written and holds the writer there, and the test
  // kills it then: every kill lands mid-write, however busy the machine (the
  // wait is for that event; only a hang reaches its bound). The new
  // checkpoint goes to PATH.part, renamed over the old one, so the path
  // always holds a whole checkpoint: the one before.
  test::TempDir dir;
  GptConfig config;
  config.n_layer = 2;
  config.n_embd = 128;
  config.seq_len = 16;
  constexpr int kKills = 3;
  for (int trial = 0; trial < kKills; ++trial) {
    const std::string ckpt = dir.file("ckpt.h5"), mark = dir.file("mid-write");
    std::filesystem::remove(ckpt);
    std::filesystem::remove(ckpt + ".part");
    std::filesystem::remove(mark);
    const pid_t child = fork();
    if (child == 0) {
      setenv("LD_PRELOAD", test::paths::slow_fwrite, 1);
      setenv("NANSCOPE_TEST_WRITING_MARK", mark.c_str(), 1);
      const std::string run_dir = dir.file("run");
      execl(test::paths::train_exe, test::paths::train_exe, "--model", "gpt", "--n-layer", "2", "--n-embd", "128",
            "--seq-len", "16", "--batch-size", "1", "--steps", "1000000", "--checkpoint-every", "1", "--save",
            ckpt.c_str(), "--probe", "off", "--quiet", "--threads", "1", "--run-dir", run_dir.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    // Below ctest's timeout: a shim that never marks (a write call it does not
    // wrap) fails here, naming the cause, instead of timing out.
    const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool exited = false;
    while (!std::filesystem::exists(mark) && !exited && std::chrono::steady_clock::now() < bound) {
      exited = waitpid(child, nullptr, WNOHANG) == child;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_FALSE(exited) << "trial " << trial << ": nanscope-train exited before its second checkpoint";
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    ASSERT_TRUE(std::filesystem::exists(mark))
        << "trial " << trial
        << ": no checkpoint write was marked within 120 s (does the slow-write shim wrap the call this HDF5 "
           "writes with?)";
    EXPECT_TRUE(std::filesystem::exists(ckpt + ".part")) << "trial " << trial << ": killed mid-write";
    ASSERT_TRUE(std::filesystem::exists(ckpt)) << "trial " << trial;
    auto model = make_gpt(config, 1);
    int64_t step = -1;
    EXPECT_NO_THROW(step = load_checkpoint(ckpt, *model)) << "trial " << trial;
    EXPECT_GE(step, 1) << "trial " << trial;
  }
}
