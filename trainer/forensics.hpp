#pragma once
// What the trainer does with the probe on a non-finite step: re-run the step
// under op-level capture and write the snapshot, before the fallback changes
// anything (weights, optimizer state and precision are still the step's own).
#include <torch/optim/optimizer.h>

#include <map>
#include <string>

#include "model.hpp"
#include "nanscope/probe/probe.hpp"
#include "options.hpp"
#include "train_step.hpp"

namespace nanscope {

struct FailedStep {
  int64_t step = 0;
  Amp amp = Amp::off;
  double loss_scale = 1;
  double lr = 0;
  at::Tensor inputs, targets;
  std::vector<float> layer_grad_norm;
};

struct ForensicsResult {
  format::Capture capture;
  std::string snapshot_path;  // "" when it could not be written
};

ForensicsResult investigate_failed_step(probe::Probe& probe, TrainableModel& model,
                                        torch::optim::Optimizer& optimizer,
                                        const std::vector<at::Tensor>& parameters,
                                        const std::vector<Fault>& faults, const TrainOptions& options,
                                        const std::map<std::string, std::string>& config,
                                        const FailedStep& failed);

// "nan at aten::log (forward) in blocks.0.mlp" — for logs and events.
std::string describe_birth(const format::Capture& capture);

}  // namespace nanscope
