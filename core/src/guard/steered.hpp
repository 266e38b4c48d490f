#pragma once
// What a StepGuard steers: the model it trains and the optimizer that applies
// the update (or a stand-in without one), and the loop's loss function for
// re-runs. Private to the guard's files.
#include <memory>
#include <optional>
#include <string>

#include <torch/optim/optimizer.h>

#include "nanscope/core/closure_model.hpp"
#include "nanscope/core/loss_closure.hpp"
#include "nanscope/core/step_guard.hpp"

namespace nanscope {

struct Steered {
  // `optimizer` null: the loop applies its own update rule.
  Steered(GuardedModel model, torch::optim::Optimizer* optimizer, const std::string& model_name);
  // The closure step's model (a guard given a module or an owned body); null
  // for a borrowed TrainableModel. Declared first: `model` refers to it.
  std::unique_ptr<ClosureModel> closure;
  // Without the loop's optimizer: a stand-in holding the parameters (rollback
  // states, checkpoints), never stepped. Declared first: `optimizer` refers to it.
  std::unique_ptr<torch::optim::Optimizer> stand_in;
  TrainableModel& model;
  torch::optim::Optimizer& optimizer;
  bool applies_update;  // false: the loop's own rule applies it
  // The optimizer evaluates the loss itself (L-BFGS): asked once, not at each
  // call (the cross-cast costs a clean step microseconds).
  bool update_evaluates_closure;
  BatchLoss loss_fn;  // the watched form's: what re-runs a micro-batch

  // The closure step's model, or std::logic_error for a borrowed TrainableModel.
  ClosureModel& closure_model();
  // Whether a step can run again: the closure step always; a watched one
  // (`watched`: the loop ran forward and backward) through the loss function.
  bool rerunnable(bool watched) const { return !watched || loss_fn; }
  // Whether batches other than the step's own (a row left out, an earlier
  // step) can run: through the loss function, or a closure that takes its batch.
  bool runs_other_batches(bool watched) const { return !other_batches_need_loss_fn(watched) || loss_fn; }
  // Installs the loss function where runs_other_batches needs it, for `batch`.
  void run_other_batches_through_loss_fn(std::optional<ClosureModel::Step>& scope, bool watched, const Batch& batch);

 private:
  // A watched step, or a closure over its own batch only, runs another batch
  // through the loss function alone.
  bool other_batches_need_loss_fn(bool watched) const { return watched || (closure && !closure->runs_any_batch()); }
  static std::unique_ptr<ClosureModel> closure_of(GuardedModel& given, const std::string& model_name);
  static TrainableModel& trained(const std::unique_ptr<ClosureModel>& closure, const GuardedModel& given);
};

}  // namespace nanscope
