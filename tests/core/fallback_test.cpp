#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include "../support/tiny_models.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/fallback.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/models/make_optimizer.hpp"

using namespace nanscope;

namespace {

// A tiny MLP in `type` whose AdamW has taken one step (its state exists).
struct Trained {
  explicit Trained(at::ScalarType type) : model(test::tiny_mlp()) {
    model->to(at::kCPU, type);
    for (const auto& [name, p] : model->named_parameters()) params.push_back(p);
    optimizer = make_optimizer(OptimizerKind::adamw, params, 1e-3, 0.0);
    for (auto& p : params) p.mutable_grad() = at::ones_like(p);
    optimizer->step();
  }
  std::unique_ptr<TrainableModel> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

LossScaler enabled_scaler() {
  LossScalerConfig config;
  config.enabled = true;
  return LossScaler(config);
}

}  // namespace

TEST(Fallback, CastsOptimizerStateToFp32AndDisablesTheScaler) {
  Trained t(at::kFloat);
  LossScaler scaler = enabled_scaler();
  FallbackPolicy policy(FallbackMode::whole);
  EXPECT_FALSE(policy.fired());
  EXPECT_TRUE(policy.fire(*t.model, *t.optimizer, scaler, at::kCPU, 3)) << "the model now runs in fp32";
  for (const auto& [name, p] : t.model->named_parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat) << name;
  for (const auto& s : optimizer_state_tensors(*t.optimizer)) EXPECT_EQ(s.scalar_type(), at::kFloat);
  EXPECT_FALSE(scaler.enabled());
  EXPECT_EQ(policy.fired_step(), 3);
}

// A model trained in bf16 itself keeps its weights, its optimizer state and
// its scaler: widening them would change the dtype its loop feeds it (a bf16
// batch into float32 weights raises) and double its memory.
TEST(Fallback, AModelOfItsOwn16BitWeightsKeepsThem) {
  Trained t(at::kBFloat16);
  for (const auto& s : optimizer_state_tensors(*t.optimizer)) ASSERT_EQ(s.scalar_type(), at::kBFloat16);
  LossScaler scaler = enabled_scaler();
  FallbackPolicy policy(FallbackMode::whole);
  EXPECT_FALSE(policy.fire(*t.model, *t.optimizer, scaler, at::kCPU, 3));
  EXPECT_TRUE(policy.fired());
  for (const auto& [name, p] : t.model->named_parameters()) EXPECT_EQ(p.scalar_type(), at::kBFloat16) << name;
  for (const auto& s : optimizer_state_tensors(*t.optimizer)) EXPECT_EQ(s.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(scaler.enabled());
}
