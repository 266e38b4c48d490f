#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "../support/tiny_models.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/fallback.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/models/make_optimizer.hpp"

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

  FallbackPolicy policy(FallbackMode::whole);
  EXPECT_FALSE(policy.fired());
  policy.fire(*model, *optimizer, scaler, at::kCPU, 3);
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
  for (const auto& t : optimizer_state_tensors(*optimizer)) EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_FALSE(scaler.enabled());
  EXPECT_EQ(policy.fired_step(), 3);
}
