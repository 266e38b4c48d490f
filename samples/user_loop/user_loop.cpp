// A LibTorch training loop of your own, with the nanscope probe attached.
// Build: link nanscope_probe (see samples/user_loop/CMakeLists.txt).
#include <torch/torch.h>

#include <iostream>

#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/probe.hpp"

struct Net : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 8))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(8, 1))};
  bool buggy = false;  // a bug that shows on one batch: log of a negative
  torch::Tensor forward(torch::Tensor x) {
    {
      NANSCOPE_MODULE_SCOPE("fc");  // attributes the ops below to "fc"
      x = torch::relu(fc(x)) - 0.5;
      if (buggy) x = torch::log(x);
    }
    NANSCOPE_MODULE_SCOPE("head");
    return head(x);
  }
};

int main(int argc, char** argv) {
  const std::string run_dir = argc > 1 ? argv[1] : "user-loop-run";
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  torch::optim::SGD optimizer(net->parameters(), 0.05);
  std::vector<std::string> names;
  for (const auto& p : net->named_parameters()) names.push_back(p.key());
  nanscope::probe::Probe probe({run_dir, {}}, names);

  for (int64_t step = 0; step < 20; ++step) {
    torch::Tensor x = torch::randn({16, 4}), y = x.sum(1, true);
    probe.begin_step(step, torch::arange(16));        // RNG state, batch rows
    torch::Tensor bad_batch = probe.batch_nonfinite(x);  // stays on the device
    net->buggy = step == 12;
    torch::Tensor loss;
    auto forward_backward = [&] {  // the part of the step the probe may re-run
      optimizer.zero_grad();
      loss = torch::mse_loss(net->forward(x), y);
      loss.backward();
    };
    forward_backward();
    // One host read per step: the loss and the batch flag together.
    torch::Tensor host = torch::cat({loss.detach().reshape(1), bad_batch}).cpu();
    const bool finite = std::isfinite(host[0].item<float>()) && host[1].item<float>() == 0;
    if (finite) {
      optimizer.step();
      continue;
    }
    // Skip the step, then ask the probe where the NaN was born.
    nanscope::format::Capture capture = probe.investigate(forward_backward, x);
    optimizer.zero_grad();
    if (capture.first_birth) {
      const auto& b = *capture.first_birth;
      std::cout << "step " << step << ": first birth: " << b.kind << " at " << b.op.op << " in '"
                << b.op.module << "' (" << b.op.phase << ")\n";
    }
    nanscope::probe::SnapshotContents snapshot;
    snapshot.step = step;
    snapshot.model_name = "user";
    for (const auto& p : net->named_parameters()) snapshot.parameters.emplace_back(p.key(), p.value());
    snapshot.inputs = x;
    snapshot.targets = y;
    snapshot.batch_rows = probe.batch_rows();
    snapshot.precision = "fp32";
    snapshot.capture = capture;
    std::cout << "snapshot: " << probe.save_snapshot(snapshot) << "\n";
  }
  return 0;
}
