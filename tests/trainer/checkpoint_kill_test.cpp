// A checkpoint is whole whenever nanscope-train is killed, even mid-write.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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
    const std::string ckpt = dir.file("ckpt.h5");
    std::filesystem::remove(ckpt);
    std::filesystem::remove(ckpt + ".part");
    // The bound is below ctest's timeout: a shim that never marks fails here, naming the cause.
    const std::string failed = test::kill_at_second_checkpoint({test::paths::train_exe,
                                                                "--model",
                                                                "gpt",
                                                                "--n-layer",
                                                                "2",
                                                                "--n-embd",
                                                                "128",
                                                                "--seq-len",
                                                                "16",
                                                                "--batch-size",
                                                                "1",
                                                                "--steps",
                                                                "1000000",
                                                                "--checkpoint-every",
                                                                "1",
                                                                "--save",
                                                                ckpt,
                                                                "--probe",
                                                                "off",
                                                                "--quiet",
                                                                "--threads",
                                                                "1",
                                                                "--run-dir",
                                                                dir.file("run")},
                                                               dir.file("mid-write"));
    ASSERT_EQ(failed, "") << "trial " << trial;
    EXPECT_TRUE(std::filesystem::exists(ckpt + ".part")) << "trial " << trial << ": killed mid-write";
    ASSERT_TRUE(std::filesystem::exists(ckpt)) << "trial " << trial;
    auto model = make_gpt(config, 1);
    int64_t step = -1;
    EXPECT_NO_THROW(step = load_checkpoint(ckpt, *model)) << "trial " << trial;
    EXPECT_GE(step, 1) << "trial " << trial;
  }
}
