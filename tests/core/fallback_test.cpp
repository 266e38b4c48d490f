#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "../support/tiny_models.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/fallback.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_file.hpp"

using namespace nanscope;

TEST(Fallback, CastsModelAndOptimizerStateToFp32AndDisablesTheScaler) {
  auto model = test::tiny_mlp();
  model->to(at::kCPU, at::kBFloat16);  // as a model trained in low precision would be
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : model->named_parameters()) params.push_back(p);
  auto optimizer = make_optimizer(OptimizerKind::adamw, params, 1e-3, 0.0);
  for (auto& p : params) p.mutable_grad() = at::ones_like(p);
  optimizer->step();
  for (const auto& t : optimizer_state_tensors(*optimizer)) ASSERT_EQ(t.scalar_type(), at::kBFloat16);
  LossScalerConfig config;
  config.enabled = true;
  LossScaler scaler(config);

  FallbackPolicy policy(FallbackMode::whole, 0.5, 1.0);
  EXPECT_DOUBLE_EQ(policy.lr_multiplier(), 1.0);
  policy.fire(*model, *optimizer, scaler, at::kCPU, 3);
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
  for (const auto& t : optimizer_state_tensors(*optimizer)) EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_FALSE(scaler.enabled());
  EXPECT_DOUBLE_EQ(policy.lr_multiplier(), 0.5);
  EXPECT_EQ(policy.fired_step(), 3);
}

TEST(Fallback, FiresOnlyOnceAndLeavesFp16OverflowToTheScaler) {
  StepOutcome bad_grads;
  bad_grads.grads_finite = false;
  StepOutcome bad_loss;
  bad_loss.loss_finite = false;
  LossScalerConfig config;
  config.enabled = true;
  LossScaler scaler(config);
  FallbackPolicy policy(FallbackMode::whole, 0.5, 1.0);
  EXPECT_FALSE(policy.should_fire(Amp::fp16, bad_grads, scaler)) << "scale 65536: the scaler's job";
  EXPECT_TRUE(policy.should_fire(Amp::fp16, bad_loss, scaler));
  EXPECT_TRUE(policy.should_fire(Amp::bf16, bad_grads, scaler));
  for (int i = 0; i < 17; ++i) scaler.update(true);  // 65536 * 0.5^17 = 0.5 < 1
  EXPECT_TRUE(policy.should_fire(Amp::fp16, bad_grads, scaler));
  auto model = test::tiny_mlp();
  std::vector<at::Tensor> params;
  for (const auto& [name, p] : model->named_parameters()) params.push_back(p);
  auto optimizer = make_optimizer(OptimizerKind::sgd, params, 1e-3, 0.0);
  policy.fire(*model, *optimizer, scaler, at::kCPU, 0);
  EXPECT_FALSE(policy.should_fire(Amp::fp32, bad_loss, scaler)) << "one shot only";
  EXPECT_FALSE(FallbackPolicy(FallbackMode::off, 0.5, 1.0).should_fire(Amp::bf16, bad_loss, scaler));
}
