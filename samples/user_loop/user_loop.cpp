// A LibTorch training loop of your own, run through nanscope's step guard:
// autocast, skip-the-batch, the probe, snapshots and the fp32 fallback.
#include <iostream>

#include "nanscope/core/step_guard.hpp"
#include "net.hpp"

int main(int argc, char** argv) {
  const std::string run_dir = argc > 1 ? argv[1] : "user-loop-run";
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto model = make_model(net);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  nanscope::StepGuard guard(*model, optimizer, {run_dir, nanscope::Amp::bf16});

  for (int64_t step = 0; step < 20; ++step) {
    torch::Tensor counts = torch::randint(0, 10, {16, 4}).to(torch::kFloat), y = counts.sum(1, true);
    if (step == 12) counts[3][1] = -1;  // a missing count, as real data has them
    nanscope::GuardedStep r = guard.step(step, counts, y);
    if (!r.first_birth.empty()) std::cout << "step " << step << ": first birth: " << r.first_birth << "\n";
    if (!r.snapshot.empty()) std::cout << "snapshot: " << r.snapshot << "\n";
  }
  std::cout << "run file: " << guard.run_file() << "\n";
  return 0;
}
