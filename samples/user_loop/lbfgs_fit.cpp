// A float64 fit with L-BFGS, an optimizer that evaluates the loss itself at
// trial points, through the guard's closure step. The scale of a Gaussian is
// a raw parameter (no softplus keeps it positive): a long step moves it below
// zero at a trial point, and log(sigma) is NaN there. The guard skips that
// step with the weights and the optimizer's state as before it, names the
// birth at the trial point, and the run goes on at its own precision. Given a
// snapshot's path, the same program replays it.
#include <torch/torch.h>

#include <iostream>

#include "nanscope/nanscope.hpp"
#include "nanscope/replay/model_registry.hpp"

struct GaussianFit : torch::nn::Module {
  torch::Tensor mu = register_parameter("mu", torch::full({1}, 3.0, torch::kDouble));
  torch::Tensor sigma = register_parameter("sigma", torch::ones({1}, torch::kDouble));
  torch::Tensor nll(const torch::Tensor& y) {
    return torch::log(sigma).sum() + ((y - mu).pow(2) / (2 * sigma.pow(2))).mean();
  }
};

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const torch::Tensor y = 3 + 0.5 * torch::randn({64}, torch::kDouble);
  GaussianFit model;
  auto loss_of = [&](const nanscope::Batch& b) { return model.nll(b.inputs); };
  const std::string arg = argc > 1 ? argv[1] : "lbfgs-run";
  if (arg.size() > 3 && arg.substr(arg.size() - 3) == ".h5")
    return nanscope::replay::replay_main(argc, argv, model, loss_of);

  torch::optim::LBFGS optimizer(model.parameters(), torch::optim::LBFGSOptions(0.01).max_iter(2));
  nanscope::GuardOptions options{arg};
  options.fallback = nanscope::FallbackMode::off;  // this sample shows the skip alone
  nanscope::StepGuard guard(model, optimizer, options);
  int skipped = 0;
  for (int64_t step = 0; step < 4; ++step) {
    // One long step (a learning rate far too high for it), the others short.
    optimizer.param_groups()[0].options().set_lr(step == 1 ? 3.0 : 0.01);
    const torch::Tensor mu = model.mu.detach().clone(), sigma = model.sigma.detach().clone();
    nanscope::GuardedStep r = guard.closure_step(loss_of, nanscope::Batch(y));
    if (r.counted()) continue;
    ++skipped;
    std::cout << "step " << step << ": first birth: " << r.first_birth << "\n";
    if (!torch::equal(model.mu, mu) || !torch::equal(model.sigma, sigma)) {
      std::cout << "the skipped step moved the weights\n";
      return 1;
    }
    std::cout << "weights as before the step; dtype " << model.mu.dtype() << "\n";
    if (!r.snapshot.empty()) std::cout << "snapshot: " << r.snapshot << "\n";
  }
  std::cout << skipped << " step(s) skipped; run file: " << guard.run_file() << "\n";
  return skipped == 1 ? 0 : 1;
}
