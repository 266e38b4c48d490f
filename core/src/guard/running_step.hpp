#pragma once
// A guarded step between its begin and end phases, whichever form runs it
// (the closure step, or the watched step the loop runs). Private to the
// guard's files.
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "guard/model_calls.hpp"
#include "nanscope/core/guarded_step.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/core/train_step.hpp"

namespace nanscope {

struct RunningStep {
  int64_t step = 0;
  StepContext context;
  StepSetup setup;  // the harness's for this step (set_step_setup), for the step and every re-run of it
  StepSettings settings;
  // What the step runs with, fixed as it begins.
  Amp amp = Amp::fp32;
  double lr = 0;          // of the update: the loop's (or its schedule's) times the guard's cuts
  double loss_scale = 1;  // the scale it ran with
  std::chrono::steady_clock::time_point start;
  // What the step came to (train_step's outcome), and what the model raised
  // (the step was skipped); the step's GuardedStep is built from these and
  // its stages' values as it ends.
  StepOutcome outcome;
  std::string error;
  std::vector<MicroBatch> micro_batches;  // the closure step's one batch, or the watched step's micro-batches
  bool watched = false;                   // the loop ran forward and backward: re-runs go through its loss_fn
  std::optional<std::vector<std::string>> fp32_not_entered;  // planned fp32 modules, checked on the first step
  // Micro-batches whose loss came after several calls of the model: which
  // call it used is decided if the step fails (decide_micro_batches).
  std::vector<UndecidedMicroBatch> undecided;
  size_t calls_outside_losses = 0;  // of those, the calls no loss given to the guard used (once decided)
  // An optimizer that evaluates a closure (L-BFGS): what its evaluations came
  // to; the forensics re-run the one that failed, at its trial weights.
  ClosureEvaluations evaluations;
  // The loss scaler's growth count as the step began: a step whose scale
  // made none of its NaN/Inf keeps the scale and the count it had.
  int64_t growth_tracker_before = 0;
  // Under loss scaling, a step that stayed non-finite re-run at a scale of 1:
  // the scale is no cause, and every re-run of it (forensics, diagnosis,
  // its snapshot's replay) runs at 1, where the scale cannot hide the birth.
  std::optional<double> rerun_scale;
  // The loss op that counted none of a left-out micro-batch's targets
  // (aten::cross_entropy_loss; StepOutcome::adding_nothing).
  std::string no_target_op;
  double loss_scale_for_reruns() const { return rerun_scale.value_or(loss_scale); }
};

// While alive, the parameters hold the weights a closure optimizer's failed
// evaluation ran at (none: nothing changes); then they are as before.
class AtFailedEvaluation {
 public:
  AtFailedEvaluation(const std::vector<at::Tensor>& parameters, const ClosureEvaluations& evaluations);
  ~AtFailedEvaluation();
  AtFailedEvaluation(const AtFailedEvaluation&) = delete;
  AtFailedEvaluation& operator=(const AtFailedEvaluation&) = delete;

 private:
  const std::vector<at::Tensor>& parameters_;
  std::vector<at::Tensor> before_;
};

}  // namespace nanscope
