#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "../support/test_support.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/trainer/trainer.hpp"
#include "test_models.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

TEST(FallbackRun, RunSkipsBothFaultsFallsBackOnceAndTrainsOn) {
  test::TempDir dir;
  TrainOptions o = test::quick_mlp_run(dir.file("run"), 40);
  o.amp = Amp::bf16;
  o.faults = {parse_fault("log_nonpositive@5"), parse_fault("zero_variance_norm@20")};
  TrainSummary summary = run(o, std::cerr);
  EXPECT_EQ(summary.skipped, 2);
  EXPECT_EQ(summary.fallback_step, 5);

  format::RunData r = format::read_run(summary.run_file);
  ASSERT_EQ(r.rows(), 40u);
  for (size_t s = 0; s < r.rows(); ++s) {
    const bool planted = s == 5 || s == 20;
    EXPECT_EQ(r.skipped[s], planted ? 1 : 0) << "step " << s;
    EXPECT_EQ(std::isfinite(r.loss[s]), !planted) << "step " << s;
    EXPECT_EQ(r.amp[s], s <= 5 ? 1 : 0) << "step " << s << ": bf16 up to the fallback, fp32 after";
    EXPECT_DOUBLE_EQ(r.lr[s], s <= 5 ? 1e-3 : 5e-4) << "step " << s << ": LR x 0.5 once";
  }
  int fallbacks = 0, skips = 0;
  for (const auto& e : r.events) {
    fallbacks += e.kind == format::EventKind::fallback;
    skips += e.kind == format::EventKind::skip;
  }
  EXPECT_EQ(fallbacks, 1);
  EXPECT_EQ(skips, 2);
  EXPECT_LT(r.loss[39], r.loss[0]) << "training went on after the fallback";
  ASSERT_EQ(r.layer_names.size(), 4u);  // fc1, ln, fc2, head
  EXPECT_EQ(r.layer_names[0], "fc1");
}

TEST(FallbackRun, DisabledFallbackSkipsWithoutTouchingLr) {
  test::TempDir dir;
  TrainOptions o = test::quick_mlp_run(dir.file("run"), 10);
  o.fallback = FallbackMode::off;
  o.faults = {parse_fault("exp_overflow@3")};
  TrainSummary summary = run(o, std::cerr);
  EXPECT_EQ(summary.skipped, 1);
  EXPECT_EQ(summary.fallback_step, -1);
  format::RunData r = format::read_run(summary.run_file);
  for (double lr : r.lr) EXPECT_DOUBLE_EQ(lr, 1e-3);
}

// sqrt's derivative at 0 is infinite at any loss scale: GradScaler would
// halve its scale for it; the guard re-runs the step at a scale of 1, finds
// it non-finite there too, and keeps the scale (the step is skipped and
// diagnosed as any failed step). A plain overflow is the scaler's routine
// (tests/python/test_birth_that_matters.py).
TEST(FallbackRun, Fp16RunKeepsItsScaleForAnInfiniteDerivativeTheScaleDidNotMake) {
  if (!compat::autocast_supported(c10::kCPU, at::kHalf)) GTEST_SKIP() << "fp16 CPU autocast needs LibTorch 2.x";
  test::TempDir dir;
  TrainOptions o = test::quick_mlp_run(dir.file("run"), 12);
  o.amp = Amp::fp16;
  o.faults = {parse_fault("sqrt_grad_zero@4")};
  TrainSummary summary = run(o, std::cerr);
  format::RunData r = format::read_run(summary.run_file);
  EXPECT_EQ(r.skipped[4], 1);
  EXPECT_DOUBLE_EQ(r.loss_scale[5], r.loss_scale[4]) << "no backoff: the scale made none of it";
  EXPECT_EQ(summary.fallback_step, -1);
  EXPECT_EQ(r.amp[11], 2);
}
