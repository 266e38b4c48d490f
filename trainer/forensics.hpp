#pragma once
// What the trainer does with the probe on a non-finite step: re-run the step
// under op-level capture and write the snapshot, before the fallback changes
// anything (weights, optimizer state and precision are still the step's own).
#include <torch/optim/optimizer.h>

#include <map>
#include <string>

#include "nanscope/core/model.hpp"
#include "nanscope/probe/probe.hpp"
#include "options.hpp"
#include "nanscope/core/train_step.hpp"

namespace nanscope {

struct FailedStep {
  int64_t step = 0;
  Amp amp = Amp::off;
  double loss_scale = 1;
  double lr = 0;
  at::Tensor inputs, targets;
  std::vector<float> layer_grad_norm;
};

// The same step again under op-level capture: same weights (the step was
// skipped), RNG state (restored by the probe), precision, loss scale, batch
// and planted fault. Leaves the gradients cleared.
format::Capture rerun_under_capture(probe::Probe& probe, TrainableModel& model,
                                    const std::vector<at::Tensor>& parameters, const std::vector<Fault>& faults,
                                    const FailedStep& failed);

// Everything needed to replay the failed step elsewhere; returns the path, or
// "" when it could not be written (probe.last_error() says why).
std::string write_failed_step_snapshot(probe::Probe& probe, TrainableModel& model,
                                       torch::optim::Optimizer& optimizer, const TrainOptions& options,
                                       const std::map<std::string, std::string>& config,
                                       const FailedStep& failed, const format::Capture& capture);

// "nan at aten::log (forward) in blocks.0.mlp" — for logs and events.
std::string describe_birth(const format::Capture& capture);

}  // namespace nanscope
