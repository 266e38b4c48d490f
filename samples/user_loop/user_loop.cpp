// A LibTorch training loop of your own, run through nanscope's step guard:
// autocast, skip-the-batch, the probe, snapshots and the fp32 fallback. Given
// a snapshot's path, the same program replays it.
#include <torch/torch.h>

#include <iostream>

#include "nanscope/nanscope.hpp"
#include "nanscope/replay/model_registry.hpp"

// A regressor on counts, which it log-transforms itself.
struct Net : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 8))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(8, 1))};
  torch::Tensor forward(torch::Tensor counts) { return head(torch::relu(fc(torch::log1p(counts)))); }
};

int main(int argc, char** argv) {
  torch::manual_seed(0);
  Net net;
  auto loss_of = [&](const nanscope::Batch& b) { return torch::mse_loss(net.forward(b.inputs), b.targets); };
  const std::string arg = argc > 1 ? argv[1] : "user-loop-run";
  if (arg.size() > 3 && arg.substr(arg.size() - 3) == ".h5")
    return nanscope::replay::replay_main(argc, argv, net, loss_of);

  torch::optim::SGD optimizer(net.parameters(), 0.01);
  nanscope::StepGuard guard(net, optimizer, {arg, nanscope::Amp::bf16});
  for (int64_t step = 0; step < 20; ++step) {
    torch::Tensor counts = torch::randint(0, 10, {16, 4}).to(torch::kFloat), y = counts.sum(1, true);
    if (step == 12) counts[3][1] = -1;  // a missing count, as real data has them
    nanscope::GuardedStep r = guard.closure_step(loss_of, {counts, y});
    if (!r.counted()) std::cout << "step " << step << ": first birth: " << r.first_birth << "\n";
    if (!r.snapshot.empty()) std::cout << "snapshot: " << r.snapshot << "\n";
  }
  std::cout << "run file: " << guard.run_file() << "\n";
  return 0;
}
