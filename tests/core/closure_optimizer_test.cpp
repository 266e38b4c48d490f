// An optimizer that evaluates the loss itself (L-BFGS) through the guard's
// closure step: one row per step, a non-finite evaluation at a trial point
// skips the step with the weights and the optimizer's state as before it, and
// the birth is named at that trial point.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>

#include <sstream>

#include "../support/test_support.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/nanscope.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

namespace {

// A Gaussian fitted by its negative log-likelihood in float64, its scale a raw
// parameter (no softplus keeps it positive): a step that moves sigma below
// zero makes log(sigma) NaN.
struct GaussianFit : torch::nn::Module {
  at::Tensor mu = register_parameter("mu", torch::full({1}, 3.0, torch::kDouble));
  at::Tensor sigma = register_parameter("sigma", torch::ones({1}, torch::kDouble));
  at::Tensor nll(const at::Tensor& y) {
    return torch::log(sigma).sum() + ((y - mu).pow(2) / (2 * sigma.pow(2))).mean();
  }
};

torch::optim::LBFGSOptions lbfgs(double lr) { return torch::optim::LBFGSOptions(lr).max_iter(2); }

at::Tensor samples() {
  torch::manual_seed(0);
  return 3 + 0.5 * torch::randn({64}, torch::kDouble);
}

GuardOptions options(const std::string& run_dir, std::ostream& log) {
  GuardOptions o{run_dir, Amp::fp32};
  o.fallback = FallbackMode::off;  // the test looks at the skip alone
  o.log = &log;
  return o;
}

// The optimizer's state as the comparison needs it: L-BFGS's counters and its
// direction and history.
std::string lbfgs_state(torch::optim::Optimizer& optimizer) {
  std::ostringstream out;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::LBFGSParamState&>(*state);
    out << s.func_evals() << " " << s.n_iter() << " " << s.old_dirs().size() << " " << s.d() << " " << s.prev_loss();
  }
  return out.str();
}

// The same two steps in plain LibTorch (a short one, then a long one): at
// which evaluation of the long one does the loss go non-finite (0: none)?
// The data decide, on this machine.
int plain_failing_evaluation(const at::Tensor& y, double short_lr, double long_lr) {
  GaussianFit model;
  torch::optim::LBFGS optimizer(model.parameters(), lbfgs(short_lr));
  int evaluations = 0, failed = 0;
  auto closure = [&] {
    optimizer.zero_grad();
    at::Tensor loss = model.nll(y);
    loss.backward();
    ++evaluations;
    if (!failed && !std::isfinite(loss.item<double>())) failed = evaluations;
    return loss;
  };
  optimizer.step(closure);
  set_lr(optimizer, long_lr);
  evaluations = failed = 0;
  optimizer.step(closure);
  return failed;
}

}  // namespace

TEST(ClosureOptimizer, ANonFiniteTrialPointSkipsTheStepAsIfItNeverRan) {
  TempDir dir;
  const at::Tensor y = samples();
  GaussianFit model;
  torch::optim::LBFGS optimizer(model.parameters(), lbfgs(0.01));
  std::ostringstream log;
  StepGuard guard(model, optimizer, options(dir.file("run"), log));
  auto loss = [&] { return model.nll(y); };

  GuardedStep first = guard.closure_step(loss, {y});  // a small step: finite, and the optimizer has a history
  ASSERT_TRUE(first.counted()) << log.str();
  set_lr(optimizer, 3);  // a long step now takes sigma below zero at a trial point
  const int failing = plain_failing_evaluation(y, 0.01, 3);
  ASSERT_GT(failing, 1) << "the plain step must meet the NaN at a trial point, not at its start";

  const at::Tensor mu = model.mu.detach().clone(), sigma = model.sigma.detach().clone();
  const std::string state = lbfgs_state(optimizer);
  GuardedStep r = guard.closure_step(loss, {y});
  EXPECT_FALSE(r.counted());
  EXPECT_TRUE(torch::equal(model.mu, mu) && torch::equal(model.sigma, sigma)) << "weights as before the step";
  EXPECT_EQ(lbfgs_state(optimizer), state) << "optimizer state as before the step";
  EXPECT_EQ(r.first_birth.rfind("nan at aten::log (forward)", 0), 0u) << r.first_birth << "\n" << log.str();
  EXPECT_NE(log.str().find("at the optimizer's evaluation " + std::to_string(failing) + " of the step"),
            std::string::npos)
      << log.str();
  EXPECT_EQ(model.mu.scalar_type(), torch::kDouble);

  set_lr(optimizer, 0.01);
  EXPECT_TRUE(guard.closure_step(loss, {y}).counted()) << log.str();
  guard.flush();
  EXPECT_EQ(format::read_run(guard.run_file()).rows(), size_t(3)) << "one row per step, not per evaluation";
}

TEST(ClosureOptimizer, AFiniteStepIsThePlainStepBitForBit) {
  const at::Tensor y = samples();
  GaussianFit plain, guarded;
  torch::optim::LBFGS plain_optimizer(plain.parameters(), lbfgs(0.5)), optimizer(guarded.parameters(), lbfgs(0.5));
  TempDir dir;
  std::ostringstream log;
  StepGuard guard(guarded, optimizer, options(dir.file("run"), log));
  for (int step = 0; step < 3; ++step) {
    plain_optimizer.step([&] {
      plain_optimizer.zero_grad();
      at::Tensor loss = plain.nll(y);
      loss.backward();
      return loss;
    });
    ASSERT_TRUE(guard.closure_step([&] { return guarded.nll(y); }, {y}).counted()) << log.str();
  }
  EXPECT_TRUE(torch::equal(plain.mu, guarded.mu) && torch::equal(plain.sigma, guarded.sigma));
  EXPECT_EQ(lbfgs_state(plain_optimizer), lbfgs_state(optimizer));
}

TEST(ClosureOptimizer, TheWatchedFormSaysToUseTheClosureForm) {
  TempDir dir;
  const at::Tensor y = samples();
  GaussianFit model;
  torch::optim::LBFGS optimizer(model.parameters(), lbfgs(0.1));
  std::ostringstream log;
  StepGuard guard(model, optimizer, options(dir.file("run"), log));
  try {
    guard.backward(model.nll(y), {y});
    FAIL() << "the watched form took an optimizer that evaluates the loss itself";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("closure form"), std::string::npos) << e.what();
  }
}
