#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "../support/tiny_models.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/make_optimizer.hpp"

using namespace nanscope;

namespace {

struct Fixture {
  std::unique_ptr<TrainableModel> model = test::tiny_mlp();
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  at::Tensor inputs, targets;

  explicit Fixture(OptimizerKind optimizer_kind = OptimizerKind::adamw, double lr = 1e-2) {
    for (const auto& [name, p] : model->named_parameters()) params.push_back(p);
    optimizer = make_optimizer(optimizer_kind, params, lr, 0.0);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    inputs = at::normal(0.0, 1.0, {16, 8}, gen);
    targets = at::randint(0, 4, {16}, gen, at::kLong);
  }
  StepOutcome step(LossScaler& scaler, StepSettings settings = {}) {
    return train_step(*model, *optimizer, scaler, params, settings, Batch(inputs, targets));
  }
  std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> out;
    for (const auto& t : tensors) out.push_back(t.detach().clone());
    return out;
  }
};

void expect_bit_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].scalar_type(), b[i].scalar_type());
    EXPECT_TRUE(at::equal(a[i], b[i])) << "tensor " << i << " changed";
  }
}

}  // namespace

TEST(TrainStep, CleanStepUpdatesWeightsAndReportsFiniteNorm) {
  Fixture f;
  LossScaler scaler;
  auto before = f.clone_all(f.params);
  StepOutcome out = f.step(scaler);
  EXPECT_TRUE(out.finite());
  EXPECT_FALSE(out.skipped);
  EXPECT_GT(out.grad_norm, 0.0);
  EXPECT_FALSE(at::equal(before[0], f.params[0]));
}

TEST(TrainStep, SkippedStepLeavesWeightsAndOptimizerStateBitIdentical) {
  Fixture f;
  LossScaler scaler;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.step(scaler).finite());
  auto weights = f.clone_all(f.params);
  auto state = f.clone_all(optimizer_state_tensors(*f.optimizer));
  ASSERT_FALSE(state.empty());

  plant_fault(*f.model, {FaultKind::log_nonpositive});
  StepOutcome out = f.step(scaler);
  plant_fault(*f.model, {FaultKind::none});

  EXPECT_FALSE(out.loss_finite);
  EXPECT_TRUE(out.skipped);
  expect_bit_identical(weights, f.params);
  expect_bit_identical(state, optimizer_state_tensors(*f.optimizer));
  for (const auto& p : f.params) EXPECT_FALSE(p.grad().defined()) << "a skipped step left gradients";
}

TEST(TrainStep, BackwardOnlyFaultIsCaughtInTheGradients) {
  Fixture f;
  LossScaler scaler;
  plant_fault(*f.model, {FaultKind::sqrt_grad_zero});
  StepOutcome out = f.step(scaler);
  EXPECT_TRUE(out.loss_finite) << "sqrt(0) is finite in the forward";
  EXPECT_FALSE(out.grads_finite);
  EXPECT_TRUE(out.skipped);
}

TEST(TrainStep, ClipsTheGlobalNormOfTheUpdate) {
  // SGD's first step with momentum moves the weights by lr * grad exactly, so
  // the update's norm is the clipped gradient norm.
  Fixture f(OptimizerKind::sgd, 1.0);
  LossScaler scaler;
  auto before = f.clone_all(f.params);
  StepSettings settings;
  settings.clip = 1e-3;
  StepOutcome out = f.step(scaler, settings);
  ASSERT_GT(out.grad_norm, 1e-3);
  double sq = 0;
  for (size_t i = 0; i < f.params.size(); ++i) sq += (f.params[i] - before[i]).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(sq), 1e-3, 1e-5);
}

TEST(TrainStep, ReturnsOneNormPerParameterOnRequest) {
  Fixture f;
  LossScaler scaler;
  StepSettings settings;
  settings.parameter_norms = true;
  StepOutcome out = f.step(scaler, settings);
  ASSERT_EQ(out.parameter_norms.size(), f.params.size());
  double sq = 0;
  for (float n : out.parameter_norms) sq += double(n) * n;
  EXPECT_NEAR(std::sqrt(sq), out.grad_norm, 1e-4 * out.grad_norm);
}

TEST(TrainStep, Fp16ScalerUnscalesBeforeClipping) {
  if (!compat::autocast_supported(c10::kCPU, at::kHalf)) GTEST_SKIP() << "fp16 CPU autocast needs LibTorch 2.x";
  Fixture scaled(OptimizerKind::sgd, 1.0), plain(OptimizerKind::sgd, 1.0);
  LossScalerConfig config;
  config.enabled = true;
  LossScaler scaler(config), none;
  StepSettings settings;
  settings.amp = Amp::fp16;
  settings.clip = 0;
  StepOutcome a = scaled.step(scaler, settings);
  settings.amp = Amp::fp32;
  StepOutcome b = plain.step(none, settings);
  ASSERT_TRUE(a.finite());
  // The reported norm is the unscaled one: close to fp32's, not 65536 times it.
  EXPECT_NEAR(a.grad_norm / b.grad_norm, 1.0, 0.05);
}

namespace {

// Gradients of 100,000 values and fewer, set by hand, and their global norm
// as clip_grad_norm_ takes it (float sums) and in double.
struct LargeGradients {
  std::vector<at::Tensor> parameters;
  float torch_norm = 0;
  double double_norm = 0;
  LargeGradients() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    std::vector<at::Tensor> norms;
    double squares = 0;
    for (const int64_t n : {100003, 4099, 7}) {
      at::Tensor p = at::zeros({n}).requires_grad_(true);
      p.mutable_grad() = at::normal(0.0, 1.0, {n}, gen);
      parameters.push_back(p);
      norms.push_back(at::linalg_vector_norm(p.grad(), 2));
      squares += p.grad().to(at::kDouble).square().sum().item<double>();
    }
    torch_norm = at::linalg_vector_norm(at::stack(norms), 2).item<float>();
    double_norm = std::sqrt(squares);
  }
  StepOutcome finish(double clip) const {
    LossScaler none;
    StepSettings settings;
    settings.clip = clip;
    settings.parameter_norms = true;
    return finish_step(none, parameters, settings, at::ones({}), StepFinish{});
  }
};

}  // namespace

TEST(TrainStep, WithoutAClipTheNormsAreTakenInDoubleAndRecordedToFloatRounding) {
  const LargeGradients g;
  const StepOutcome out = g.finish(0);
  ASSERT_TRUE(out.finite());
  EXPECT_NEAR(out.grad_norm, g.double_norm, 6e-8 * g.double_norm) << "LibTorch's float sums: " << g.torch_norm;
  EXPECT_NEAR(out.grad_norm, g.torch_norm, 1e-5 * g.double_norm);
  ASSERT_EQ(out.parameter_norms.size(), g.parameters.size());
  for (size_t i = 0; i < g.parameters.size(); ++i) {
    const double expected = std::sqrt(g.parameters[i].grad().to(at::kDouble).square().sum().item<double>());
    EXPECT_NEAR(out.parameter_norms[i], expected, 6e-8 * expected) << "parameter " << i;
  }
}

TEST(TrainStep, AClipTakesItsNormAsClipGradNormDoesToTheBit) {
  const LargeGradients g;
  // The data decides, on the machine the test runs on: where LibTorch's float
  // sums happen to round to the double sum, the two ways cannot be told apart.
  if (std::abs(g.torch_norm - g.double_norm) <= 6e-8 * g.double_norm)
    GTEST_SKIP() << "LibTorch's float sums round to the double sum here: the data tells the two norms apart nowhere";
  const StepOutcome out = g.finish(1e9);  // on, and too large to act
  ASSERT_TRUE(out.finite());
  EXPECT_EQ(float(out.grad_norm), g.torch_norm);
}

TEST(TrainStep, FiniteGradientsWhoseNormOverflowsFailTheStepWithoutAClipToo) {
  // P18: each value finite, their norm beyond float: the step does not count,
  // whichever way its norms are taken.
  for (const double clip : {0.0, 1.0}) {
    at::Tensor p = at::zeros({64}).requires_grad_(true);
    p.mutable_grad() = at::full({64}, 1e20f);
    LossScaler none;
    StepSettings settings;
    settings.clip = clip;
    const StepOutcome out = finish_step(none, {p}, settings, at::ones({}), StepFinish{});
    EXPECT_TRUE(out.loss_finite) << "clip " << clip;
    EXPECT_FALSE(out.grads_finite) << "clip " << clip;
    EXPECT_TRUE(out.skipped) << "clip " << clip;
  }
}
