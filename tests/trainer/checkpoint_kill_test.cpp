// A checkpoint is whole whenever nanscope-train is killed, even mid-write.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/models/gpt.hpp"

using namespace nanscope;

TEST(CheckpointKill, SigkillWhileOneIsWrittenAlwaysLeavesALoadableOne) {
  // nanscope-train writes a checkpoint every step on a slow disk (writes in
  // pieces, LD_PRELOAD), and is killed at a random moment, until 5 kills
  // landed mid-write (how often they do depends on the machine's load: the
  // kills go on until enough did, up to 100). The new checkpoint goes to
  // PATH.part, renamed over the old one, so the path always holds a whole
  // checkpoint: the last one, or the one before it.
  test::TempDir dir;
  GptConfig config;
  config.n_layer = 2;
  config.n_embd = 128;
  config.seq_len = 16;
  std::mt19937 rng(2026);
  constexpr int kWanted = 5, kMaxTrials = 100;
  int killed_mid_write = 0, trials = 0;
  for (int trial = 0; trial < kMaxTrials && killed_mid_write < kWanted; ++trial, ++trials) {
    const std::string ckpt = dir.file("ckpt.h5");
    std::filesystem::remove(ckpt);
    const pid_t child = fork();
    if (child == 0) {
      setenv("LD_PRELOAD", test::paths::slow_fwrite, 1);
      const std::string run_dir = dir.file("run");
      execl(test::paths::train_exe, test::paths::train_exe, "--model", "gpt", "--n-layer", "2", "--n-embd", "128",
            "--seq-len", "16", "--batch-size", "1", "--steps", "1000000", "--checkpoint-every", "1", "--save",
            ckpt.c_str(), "--probe", "off", "--quiet", "--threads", "1", "--run-dir", run_dir.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(ckpt) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    ASSERT_TRUE(std::filesystem::exists(ckpt)) << "trial " << trial << ": no checkpoint within 60 s";
    killed_mid_write += std::filesystem::exists(ckpt + ".part");
    auto model = make_gpt(config, 1);
    int64_t step = -1;
    EXPECT_NO_THROW(step = load_checkpoint(ckpt, *model)) << "trial " << trial;
    EXPECT_GE(step, 1) << "trial " << trial;
  }
  // Without kills that land mid-write this test would prove nothing.
  EXPECT_GE(killed_mid_write, kWanted) << "of " << trials << " kills, " << killed_mid_write
                                       << " landed while a checkpoint was written";
}
