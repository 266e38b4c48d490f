// A GAN's loop of your own, with a guard for each model: the generator's loss
// runs the critic in train mode (its BatchNorm statistics move on every call),
// so the generator's guard is told of it (add_other_model). A bias-free
// generator turns a zero noise row into a zero sample, and the critic's
// normalisation divides 0 by 0: the birth is the critic's, outside the
// generator. The run is checked against the same loop in plain LibTorch with
// that one generator update dropped by hand. Given a snapshot's path, the
// same program replays it with the critic as it was at that step.
#include <torch/torch.h>

#include <cstring>
#include <iostream>

#include "nanscope/nanscope.hpp"
#include "nanscope/replay/model_registry.hpp"

struct Critic : torch::nn::Module {
  torch::nn::Linear features{register_module("features", torch::nn::Linear(6, 6))};
  torch::nn::BatchNorm1d norm{register_module("norm", torch::nn::BatchNorm1d(6))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(6, 1))};
  torch::Tensor forward(const torch::Tensor& x) {
    return head(norm(features(x) / x.norm(2, 1, true))).view(-1);  // as if each sample had unit length
  }
};

struct Generator : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(4, 6).bias(false)))};
  torch::Tensor forward(const torch::Tensor& z) { return fc(z); }
};

constexpr int64_t kSteps = 8, kFaultStep = 3;

torch::Tensor bce(const torch::Tensor& logits, double label) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
}

// The step's data, the same in both loops: real samples, the noise of the
// critic's fakes and that of the generator's phase, with one zero row there
// at the fault step.
struct StepData {
  torch::Tensor real = torch::randn({8, 6}), z_critic = torch::randn({8, 4}), z = torch::randn({8, 4});
};
StepData data(int64_t step) {
  StepData d;
  if (step == kFaultStep) d.z[5].zero_();
  return d;
}

// Everything the two models hold, flattened, to compare the two loops by.
torch::Tensor state_of(Generator& g, Critic& d) {
  std::vector<torch::Tensor> all;
  for (const auto& p : g.parameters()) all.push_back(p.detach().flatten().to(torch::kDouble));
  for (const auto& p : d.parameters()) all.push_back(p.detach().flatten().to(torch::kDouble));
  for (const auto& b : d.buffers()) all.push_back(b.detach().flatten().to(torch::kDouble));
  return torch::cat(all);
}

// The plain loop, the generator's update at the fault step dropped by hand,
// and the critic's statistics it made non-finite put back.
torch::Tensor plain_run() {
  torch::manual_seed(0);
  Generator g;
  Critic d;
  torch::optim::SGD opt_g(g.parameters(), 0.05), opt_d(d.parameters(), 0.05);
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [real, z_critic, z] = data(step);
    opt_d.zero_grad();
    (bce(d.forward(real), 1) + bce(d.forward(g.forward(z_critic).detach()), 0)).backward();
    opt_d.step();
    opt_g.zero_grad();
    const torch::Tensor mean = d.norm->running_mean.clone(), var = d.norm->running_var.clone();
    bce(d.forward(g.forward(z)), 1).backward();
    if (step != kFaultStep) opt_g.step();
    torch::NoGradGuard no_grad;
    if (!d.norm->running_mean.isfinite().all().item<bool>()) d.norm->running_mean.copy_(mean);
    if (!d.norm->running_var.isfinite().all().item<bool>()) d.norm->running_var.copy_(var);
  }
  return state_of(g, d);
}

int main(int argc, char** argv) {
  torch::manual_seed(0);
  Generator g;
  Critic d;
  auto generator_loss = [&](const nanscope::Batch& b) { return bce(d.forward(g.forward(b.inputs)), 1); };
  const std::string arg = argc > 1 ? argv[1] : "two-models-run";
  if (arg.size() > 3 && arg.substr(arg.size() - 3) == ".h5") {
    if (argc > 2 && std::strcmp(argv[argc - 1], "--without-critic") == 0)  // what a replay without it says
      return nanscope::replay::replay_main(argc - 1, argv, g, generator_loss);
    return nanscope::replay::replay_main(argc, argv, g, generator_loss, {{"critic", d}});
  }

  torch::optim::SGD opt_g(g.parameters(), 0.05), opt_d(d.parameters(), 0.05);
  nanscope::StepGuard guard_d(d, opt_d, {arg + "/critic"});
  nanscope::StepGuard guard_g(g, opt_g, {arg + "/generator"});
  guard_g.add_other_model({"critic", d});
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [real, z_critic, z] = data(step);
    torch::Tensor fake = g.forward(z_critic).detach();
    guard_d.closure_step([&] { return bce(d.forward(real), 1) + bce(d.forward(fake), 0); }, {real, fake});
    nanscope::GuardedStep r = guard_g.closure_step(generator_loss, nanscope::Batch(z));
    if (!r.counted()) std::cout << "step " << step << ": first birth: " << r.first_birth << "\n";
    if (!r.snapshot.empty()) std::cout << "snapshot: " << r.snapshot << "\n";
  }
  // The guard's re-runs of the failed step ran the critic too, and left no trace in it.
  const int64_t tracked = d.norm->num_batches_tracked.item<int64_t>();
  const bool same = torch::equal(state_of(g, d), plain_run()) && tracked == 3 * kSteps;
  std::cout << "critic batches tracked: " << tracked << " (the loop's calls: " << 3 * kSteps << ")\n"
            << (same ? "bit-identical to the plain loop without the skipped update\n"
                     : "DIFFERS from the plain loop without the skipped update\n");
  return same ? 0 : 1;
}
