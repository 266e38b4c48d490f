#pragma once
// The watched step as a state machine. The loop calls into a watched step in
// an order: model calls and micro-batch losses (scale/backward), at most one
// unscale(), then step(). next_phase() is that order, written once: a call
// out of it throws std::logic_error saying what comes first.
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "guard/kept_batches.hpp"
#include "guard/model_calls.hpp"
#include "guard/running_step.hpp"
#include "nanscope/core/fp32_modules.hpp"

namespace nanscope {

enum class WatchedPhase {
  closed,    // no step open: the last step() ended it
  calls,     // the model was called, no micro-batch's loss yet
  losses,    // at least one micro-batch's loss came (more calls and losses may follow)
  unscaled,  // the gradients were unscaled: only step() (or more model calls) may follow
};
enum class WatchedCall { model_call, loss, unscale, step };

// The phase after `call` in `phase` (closed after step()), or std::logic_error.
WatchedPhase next_phase(WatchedPhase phase, WatchedCall call);

// The watched step in progress: micro-batches coming in.
struct WatchedStep {
  WatchedPhase phase = WatchedPhase::closed;
  RunningStep run;
  std::vector<at::Tensor> losses;  // each micro-batch's loss as the loop gave it (detached)
  std::vector<ModelCall> calls;    // the model's calls since the last micro-batch's loss
  std::optional<UnscaledGradients> unscaled;
  std::optional<Fp32ModuleRegions> fp32;
  std::optional<probe::KernelRegions> kernels;  // the `kernel` remedy's pins, inside their modules
  std::vector<LoopTensor> loops_tensors;        // the micro-batches' tensors as the loop has them (KeptBatches)
  std::vector<at::Tensor> copies;               // the tensors of the micro-batches' copies: the next step's spares
};

}  // namespace nanscope
