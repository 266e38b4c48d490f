#pragma once
// Whether a model's whole training state is healthy: its parameters, every
// floating buffer and the optimizer's state. A NaN in any of them is a sick
// model even when training goes on (BatchNorm's running variance is read only
// in eval mode; Adam's second moment only on the next update); so is an
// infinity in a parameter or in the optimizer's state. An infinity in a
// buffer is not sick by itself: models keep them on purpose (LLaMA-style
// attention's additive causal mask of -inf, a running maximum that starts at
// -inf), and a step that writes a new one into a buffer is already caught by
// the step's own check (buffer_transaction.hpp). Used on the slow paths: a
// non-finite step, a checkpoint, a saved rollback state, a resume.
#include <torch/optim/optimizer.h>

#include <string>
#include <vector>

#include "nanscope/core/model.hpp"

namespace nanscope {

struct StateHealth {
  // "parameter NAME", "buffer NAME", "optimizer state NAME" for each sick
  // tensor, in that order.
  std::vector<std::string> nonfinite;
  bool finite() const { return nonfinite.empty(); }
  // "buffer bn.running_var, buffer bn.running_mean" (the first few, then "and N more").
  std::string text() const;
};

// One reduction per tensor and one host read for all: fine on the slow paths,
// not meant for every step.
StateHealth state_health(const TrainableModel& model, const torch::optim::Optimizer* optimizer);

// The names of the parameters that hold a NaN or an infinity (one host read).
std::vector<std::string> nonfinite_parameters(const TrainableModel& model);

}  // namespace nanscope
