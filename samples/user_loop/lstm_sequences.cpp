// A recurrent loop of your own: an LSTM over sequences of readings, its
// hidden state carried from step to step (truncated backpropagation through
// time), and a loss that raises on a NaN (binary_cross_entropy checks its
// input). The micro-batch the guard keeps is nested, (data, targets, h, c),
// and each tensor holds its samples along its own dimension (the state's
// second): the guard finds each one's rows itself. At step 4 one reading of
// sample 3 is missing (NaN): the loss raises, the guard skips the step with
// that birth and snapshots it, and the loop keeps its state from before the
// step. Given a snapshot's path, the same program replays it.
#include <torch/torch.h>

#include <iostream>

#include "nanscope/nanscope.hpp"
#include "nanscope/replay/model_registry.hpp"

constexpr int64_t kBatch = 8, kSteps = 8, kFaultStep = 4, kFaultSample = 3;

struct Sequences : torch::nn::Module {
  torch::nn::LSTM lstm{register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(4, 16).batch_first(true)))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(16, 1))};
  // The probability of each reading's event, and the state after the sequence.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& h,
                                                                  const torch::Tensor& c) {
    auto [out, state] = lstm(x, std::make_tuple(h, c));
    return {torch::sigmoid(head(out)).squeeze(-1), std::get<0>(state), std::get<1>(state)};
  }
};

int main(int argc, char** argv) {
  torch::manual_seed(0);
  Sequences model;
  torch::Tensor next_h, next_c;  // the state the latest forward left
  auto loss_of = [&](const nanscope::Batch& b) {
    auto [p, h, c] = model.forward(b.leaves[0], b.leaves[2], b.leaves[3]);
    next_h = h.detach(), next_c = c.detach();
    return torch::binary_cross_entropy(p, b.leaves[1]);  // raises on a NaN probability
  };
  const std::string arg = argc > 1 ? argv[1] : "sequences-run";
  if (arg.size() > 3 && arg.substr(arg.size() - 3) == ".h5")
    return nanscope::replay::replay_main(argc, argv, model, loss_of);

  torch::optim::Adam optimizer(model.parameters(), 1e-2);
  // fp32: LibTorch 2.x's oneDNN has no bf16 LSTM on every CPU (it raises, guard or not).
  nanscope::StepGuard guard(model, optimizer, {arg});
  torch::Tensor h = torch::zeros({1, kBatch, 16}), c = torch::zeros({1, kBatch, 16});
  for (int64_t step = 0; step < kSteps; ++step) {
    torch::Tensor x = torch::randn({kBatch, 12, 4}), y = (x.sum(-1) > 0).to(torch::kFloat);
    if (step == kFaultStep) x[kFaultSample][5][2] = NAN;  // a missing reading
    nanscope::GuardedStep r = guard.closure_step(loss_of, nanscope::Batch::of({x, y, h, c}));
    if (r.counted()) {
      h = next_h, c = next_c;  // truncated BPTT: the state goes on, its graph does not
      continue;
    }
    std::cout << "step " << step << ": first birth: " << r.first_birth << "\n"
              << "step " << step << ": the loss raised: " << r.error << "\n";
    if (!r.snapshot.empty()) std::cout << "snapshot: " << r.snapshot << "\n";
  }
  std::cout << "state finite: " << std::boolalpha
            << (h.isfinite().all().item<bool>() && c.isfinite().all().item<bool>()) << "\n";
  return 0;
}
