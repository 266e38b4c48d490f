// A micro-batch with no target. Under gradient accumulation, a micro-batch
// whose every label is ignored (a prompt-only sample, a token-classification
// micro-batch all padding) takes its loss's mean over no target: 0 / 0, a
// NaN loss, with exactly zero gradients. It adds nothing to the update, and
// the plain loop's update (GradScaler reads the gradients only) is the other
// micro-batches'. Skipping the whole step for that NaN would throw the good
// micro-batches away. So each micro-batch whose loss is non-finite is re-run
// alone under op capture (its RNG state, its precision): where the birth that
// reaches its loss is a loss that counted none of its targets, and its
// gradients are exactly zero, it is left out (finish_step) and the update
// goes on with the others. Anything else (a NaN gradient, another birth, a
// step whose every micro-batch has no target) is a failed step as before. A
// step that cannot be re-run (no loss function), a closure optimizer's, or
// one of several ranks (whose re-runs would have to agree) is one too.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "guard/step_guard_impl.hpp"
#include "nanscope/core/generator_states.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/probe/birth_category.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {
namespace {

// What the re-run left in .grad is exactly zero (a NaN counts as non-zero).
bool gradients_all_zero(const std::vector<at::Tensor>& parameters) {
  at::Tensor nonzero;
  for (const at::Tensor& grad : defined_grads(parameters)) {
    const at::Tensor count = grad.count_nonzero();
    nonzero = nonzero.defined() ? nonzero + count : count;
  }
  return !nonzero.defined() || nonzero.item<int64_t>() == 0;
}

}  // namespace

std::string micro_batches_left_out_text(const RunningStep& run) {
  const std::vector<size_t>& left_out = run.outcome.adding_nothing;
  std::string which;
  for (size_t k : left_out) which += (which.empty() ? "" : ", ") + std::to_string(k);
  const size_t total = run.micro_batches.size(), kept = total - left_out.size();
  // Within an event's width (240 bytes): the op's name is the one part that varies much.
  return std::string(left_out.size() > 1 ? "micro-batches " : "micro-batch ") + which + " of " + std::to_string(total) +
         " left out: loss nan, a mean over no target (" + run.no_target_op +
         " counted none), gradients exactly zero; the update went on with the other " + std::to_string(kept) +
         ", as a plain loop's";
}

StepRecomputation StepGuard::Impl::rerun_as_the_step_ran(const RunningStep& run,
                                                         const std::vector<MicroBatch>& micro_batches,
                                                         double loss_scale, probe::OpCapture* capture) {
  std::optional<Fp32ModuleRegions> fp32;
  if (run.watched && fp32_regions_apply(run.amp, fp32_modules())) fp32.emplace(steered_.model, fp32_modules());
  std::optional<ClosureModel::Step> with_loss_fn;
  if (run.watched) with_loss_fn.emplace(steered_.closure_model(), steered_.loss_fn, micro_batches.front().batch);
  return recompute_step(steered_.model, parameters_, run.amp, loss_scale, run.setup, micro_batches, capture);
}

std::vector<size_t> StepGuard::Impl::losses_adding_nothing(RunningStep& run, const StepOutcome& outcome) {
  if (!options_.probe || !steered_.rerunnable(run.watched) || run.context.averager || run.evaluations.failed > 0)
    return {};
  if (outcome.micro_losses.size() != run.micro_batches.size()) return {};
  std::vector<size_t> nonfinite;
  for (size_t k = 0; k < outcome.micro_losses.size(); ++k)
    if (!std::isfinite(outcome.micro_losses[k])) nonfinite.push_back(k);
  if (nonfinite.empty() || nonfinite.size() == run.micro_batches.size()) return {};
  for (size_t k : nonfinite)
    if (run.micro_batches[k].written != InPlaceWrite::none) return {};  // not as it was at its backward
  decide_micro_batches(run);                                            // the batch each loss was computed on
  // The step's gradients stand aside while each re-run makes its own, and
  // come back as they were; so do the loop's random generators.
  std::vector<at::Tensor> step_gradients;
  for (const at::Tensor& p : parameters_) step_gradients.push_back(p.grad());
  const KeepGeneratorStates loop_generators;
  bool no_target = true;
  for (size_t k : nonfinite) {
    try {
      probe::OpCapture capture;
      const StepRecomputation alone = rerun_as_the_step_ran(run, {run.micro_batches[k]}, 1.0, &capture);
      const format::Capture found = capture.result();
      no_target = !std::isfinite(alone.loss.item<double>()) && gradients_all_zero(parameters_) && found.first_birth &&
                  probe::category_of(*found.first_birth) == format::Category::all_targets_ignored;
      if (no_target) run.no_target_op = found.first_birth->op.op;
    } catch (const std::exception&) {
      no_target = false;  // the failed step's forensics meet the error again and say it
    }
    if (!no_target) break;
  }
  clear_grads(parameters_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor param = parameters_[i];
    if (step_gradients[i].defined()) param.mutable_grad() = step_gradients[i];
  }
  return no_target ? nonfinite : std::vector<size_t>{};
}

}  // namespace nanscope
