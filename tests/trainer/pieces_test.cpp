// The small pieces of the harness: batches, schedule, fault specs, checkpoints.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "../test_paths.hpp"
#include "data.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/fault.hpp"
#include "nanscope/core/models/gpt.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/probe/layer_index.hpp"
#include "schedule.hpp"
#include "test_models.hpp"

using namespace nanscope;

TEST(BatchSampler, WithoutShuffleBatchIIsRowsIBToIPlus1BWrappingAround) {
  BatchSampler sampler(10, 4, /*shuffle=*/false, 0);
  auto rows = [&](int64_t step) {
    at::Tensor r = sampler.rows(step);
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  EXPECT_EQ(rows(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(rows(2), (std::vector<int64_t>{8, 9, 0, 1}));
  EXPECT_EQ(rows(5), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(BatchSampler, ShuffleIsSeededAndCoversEachEpochOnce) {
  BatchSampler a(12, 4, true, 3), b(12, 4, true, 3), c(12, 4, true, 4);
  std::set<int64_t> epoch;
  bool differs = false;
  for (int64_t step = 0; step < 3; ++step) {
    at::Tensor ra = a.rows(step);
    EXPECT_TRUE(at::equal(ra, b.rows(step)));
    differs |= !at::equal(ra, c.rows(step));
    for (int64_t i = 0; i < 4; ++i) epoch.insert(ra[i].item<int64_t>());
  }
  EXPECT_EQ(epoch.size(), 12u);
  EXPECT_TRUE(differs) << "another seed gives another order";
}

TEST(BuiltinData, TextTargetsAreInputsShiftedByOne) {
  Dataset d = builtin_text_dataset(32);
  ASSERT_GT(d.size(), 100);
  EXPECT_EQ(d.inputs.size(1), 32);
  EXPECT_TRUE(at::equal(d.inputs[3].slice(0, 1), d.targets[3].slice(0, 0, 31)));
}

TEST(Schedule, WarmupIsLinearAndCosineEndsAtZero) {
  EXPECT_DOUBLE_EQ(scheduled_lr("constant", 1.0, 4, 100, 0), 0.25);
  EXPECT_DOUBLE_EQ(scheduled_lr("constant", 1.0, 4, 100, 3), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr("constant", 1.0, 4, 100, 50), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr("cosine", 1.0, 0, 100, 0), 1.0);
  EXPECT_NEAR(scheduled_lr("cosine", 1.0, 0, 100, 50), 0.5, 1e-12);
  EXPECT_NEAR(scheduled_lr("cosine", 1.0, 10, 110, 110), 0.0, 1e-12);
}

TEST(FaultSpec, ParsesKindStepAndArgument) {
  Fault f = parse_fault("nonfinite_input@12:3");
  EXPECT_EQ(f.kind, FaultKind::nonfinite_input);
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.arg, 3);
  EXPECT_EQ(parse_fault("lr_spike@2").arg, 1000.0);
  EXPECT_THROW(parse_fault("log_nonpositive"), std::invalid_argument);
  EXPECT_THROW(parse_fault("bogus@1"), std::invalid_argument);
  EXPECT_THROW(parse_fault("exp_overflow@x"), std::invalid_argument);
  std::vector<Fault> plan{parse_fault("lr_spike@5:10"), parse_fault("exp_overflow@7")};
  EXPECT_EQ(lr_multiplier_at(plan, 4), 1.0);
  EXPECT_EQ(lr_multiplier_at(plan, 9), 10.0);
  EXPECT_EQ(model_fault_at(plan, 7).kind, FaultKind::exp_overflow);
  EXPECT_EQ(model_fault_at(plan, 5).kind, FaultKind::none);
}

TEST(Checkpoint, RoundTripsIntoAFreshModel) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  auto trained = test::tiny_mlp(1);
  save_checkpoint(path, *trained, 42);
  auto fresh = test::tiny_mlp(2);
  EXPECT_EQ(load_checkpoint(path, *fresh), 42);
  auto a = trained->named_parameters(), b = fresh->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(Checkpoint, RejectsAnotherModelsCheckpointByName) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  save_checkpoint(path, *test::tiny_mlp(), 1);
  auto gpt = make_gpt(GptConfig{}, 0);
  try {
    load_checkpoint(path, *gpt);
    FAIL();
  } catch (const format::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a 'mlp' model, not 'gpt'"), std::string::npos);
  }
  MlpConfig wider;
  wider.in_features = 8;
  wider.hidden = 32;
  wider.classes = 4;
  auto other = make_mlp(wider, 0);
  EXPECT_THROW(load_checkpoint(path, *other), format::FormatError);
}

TEST(Checkpoint, SigkillWhileOneIsWrittenAlwaysLeavesALoadableOne) {
  // nanscope-train writes a checkpoint every step on a slow disk (writes in
  // pieces, LD_PRELOAD), and is killed at a random moment, 20 times. The new
  // checkpoint goes to PATH.part, renamed over the old one, so the path
  // always holds a whole checkpoint: the last one, or the one before it.
  test::TempDir dir;
  GptConfig config;
  config.n_layer = 2;
  config.n_embd = 128;
  config.seq_len = 16;
  std::mt19937 rng(2026);
  int killed_mid_write = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const std::string ckpt = dir.file("ckpt.h5");
    std::filesystem::remove(ckpt);
    const pid_t child = fork();
    if (child == 0) {
      setenv("LD_PRELOAD", NANSCOPE_SLOW_FWRITE, 1);
      const std::string run_dir = dir.file("run");
      execl(NANSCOPE_TRAIN_EXE, NANSCOPE_TRAIN_EXE, "--model", "gpt", "--n-layer", "2", "--n-embd", "128", "--seq-len",
            "16", "--batch-size", "1", "--steps", "1000000", "--checkpoint-every", "1", "--save", ckpt.c_str(),
            "--probe", "off", "--quiet", "--threads", "1", "--run-dir", run_dir.c_str(), static_cast<char*>(nullptr));
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
  EXPECT_GE(killed_mid_write, 5) << "of 20 kills, " << killed_mid_write << " landed while a checkpoint was written";
}
