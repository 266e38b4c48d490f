#include <gtest/gtest.h>
#include <torch/version.h>

#include <limits>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/loss_scaler.hpp"

using nanscope::LossScaler;
using nanscope::LossScalerConfig;

namespace {

LossScalerConfig small_interval(double init, int64_t interval) {
  LossScalerConfig c;
  c.enabled = true;
  c.init_scale = init;
  c.growth_interval = interval;
  return c;
}

}  // namespace

TEST(Scaler, DefaultsAreGradScalers) {
  LossScalerConfig c;
  EXPECT_DOUBLE_EQ(c.init_scale, 65536.0);
  EXPECT_DOUBLE_EQ(c.growth_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.backoff_factor, 0.5);
  EXPECT_EQ(c.growth_interval, 2000);
}

TEST(Scaler, GrowsAfterIntervalAndBacksOffOnInfAsHandComputed) {
  LossScaler scaler(small_interval(8.0, 3));
  // inf flags per step, and the scale GradScaler.update() leaves after each.
  const bool found_inf[] = {false, false, false, false, true, false, false, false, true, true};
  const double expected[] = {8, 8, 16, 16, 8, 8, 8, 16, 8, 4};
  for (size_t i = 0; i < std::size(found_inf); ++i) {
    scaler.update(found_inf[i]);
    EXPECT_DOUBLE_EQ(scaler.scale(), expected[i]) << "after step " << i;
  }
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(Scaler, BackoffResetsTheGrowthTracker) {
  LossScaler scaler(small_interval(1024.0, 4));
  scaler.update(false);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.growth_tracker(), 3);
  scaler.update(true);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);  // three clean steps since the backoff: not yet
  scaler.update(false);
  EXPECT_DOUBLE_EQ(scaler.scale(), 1024.0);
}

TEST(Scaler, NeverGrowsToInfinity) {
  LossScaler scaler(small_interval(std::numeric_limits<double>::max(), 1));
  scaler.update(false);
  EXPECT_DOUBLE_EQ(scaler.scale(), std::numeric_limits<double>::max());
}

TEST(Scaler, DisabledScalerIsTheIdentity) {
  LossScaler scaler{LossScalerConfig{}};
  at::Tensor loss = at::full({}, 3.0);
  EXPECT_DOUBLE_EQ(scaler.scale_loss(loss).item<double>(), 3.0);
  scaler.update(true);
  EXPECT_DOUBLE_EQ(scaler.scale(), 1.0);
}

TEST(Scaler, ScalesTheLoss) {
  LossScaler scaler(small_interval(1024.0, 2000));
  EXPECT_DOUBLE_EQ(scaler.scale_loss(at::full({}, 0.5)).item<double>(), 512.0);
}

TEST(Scaler, UnscaleDividesEveryGradientAndReportsNoInf) {
  LossScaler scaler(small_interval(4.0, 2000));
  std::vector<at::Tensor> grads{at::full({3}, 8.0), at::full({2, 2}, -2.0)};
  at::Tensor found = scaler.unscale_(grads);
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(grads[0], at::full({3}, 2.0)));
  EXPECT_TRUE(at::equal(grads[1], at::full({2, 2}, -0.5)));
}

TEST(Scaler, UnscaleFlagsInfAndNaN) {
  LossScaler scaler(small_interval(4.0, 2000));
  std::vector<at::Tensor> with_inf{at::ones({3}), at::tensor({1.0f, std::numeric_limits<float>::infinity()})};
  EXPECT_EQ(scaler.unscale_(with_inf).item<float>(), 1.0f);
  std::vector<at::Tensor> with_nan{at::tensor({std::nanf("")}), at::ones({2})};
  EXPECT_EQ(scaler.unscale_(with_nan).item<float>(), 1.0f);
}

TEST(Scaler, FusedUnscaleOnCpuOnlyFromTorch2) {
  // 1.13 has no CPU kernel for _amp_foreach_non_finite_check_and_unscale_; the
  // plain-tensor path must be the one taken there.
  EXPECT_EQ(nanscope::compat::fused_unscale_available(c10::kCPU), TORCH_VERSION_MAJOR >= 2);
  EXPECT_TRUE(nanscope::compat::fused_unscale_available(c10::kCUDA));
}
