// A loss over nothing. A micro-batch whose every label is ignored (a
// prompt-only sample, a token-classification batch all padding) takes the
// mean of no element: 0/0, a NaN loss, and exactly zero gradients. No fault
// made it, and it adds nothing to the update; GradScaler, which reads the
// gradients only, lets such a step through, and the plain loop's update
// is the other micro-batches'. The guard, which reads the loss too, checks
// it: each micro-batch whose loss is non-finite is re-run alone (its RNG
// state, its precision), and when every such one adds exactly zero
// gradients, finish_step leaves them out and the update goes on with the
// others, or, with no other, skips a step that had nothing to learn from,
// without calling it a fault. A step that cannot be re-run (no loss
// function), a closure optimizer's, or one of several ranks (whose re-runs
// would have to agree) is a failed step as before.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/core/generator_states.hpp"
#include "nanscope/core/optimizer.hpp"
#include "step_guard_impl.hpp"

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

std::string nothing_to_learn_text(const StepOutcome& outcome, size_t micro_batches) {
  const std::vector<size_t>& left_out = outcome.adding_nothing;
  // "nan" whatever its sign bit (a CPU's 0/0 may set it): the word, not the bits, is the evidence.
  bool all_nan = true;
  for (size_t k : left_out) all_nan &= std::isnan(outcome.micro_losses.empty() ? outcome.loss : outcome.micro_losses[k]);
  const std::string value = std::string(all_nan ? "nan" : "non-finite") +
                            " with exactly zero gradients (a mean over no element: every label ignored, or an empty mask)";
  if (outcome.nothing_to_learn)
    return std::string(micro_batches > 1 ? "every micro-batch's loss " : "loss ") + value +
           ": the step had nothing to learn from, no fault; optimizer step skipped";
  std::string which;
  for (size_t k : left_out) which += (which.empty() ? "" : ", ") + std::to_string(k);
  const size_t kept = micro_batches - left_out.size();
  return std::string(left_out.size() > 1 ? "micro-batches " : "micro-batch ") + which + " of " +
         std::to_string(micro_batches) + ": loss " + value + "; left out, they added nothing, and the update " +
         "went on with the other " + std::to_string(kept) + (kept > 1 ? " micro-batches'" : " micro-batch's") +
         " gradients, as a plain loop's";
}

StepRecomputation StepGuard::Impl::rerun_as_the_step_ran(RunningStep& run, const std::vector<MicroBatch>& micro_batches,
                                                          double loss_scale) {
  std::optional<Fp32ModuleRegions> fp32;
  if (run.watched && fp32_regions_apply(run.result.amp, fp32_modules())) fp32.emplace(steered_.model, fp32_modules());
  std::optional<ClosureModel::Step> with_loss_fn;
  if (run.watched) with_loss_fn.emplace(closure_model(), steered_.loss_fn, micro_batches.front().batch);
  return recompute_step(steered_.model, parameters_, run.result.amp, loss_scale, run.setup, micro_batches);
}

std::vector<size_t> StepGuard::Impl::losses_adding_nothing(RunningStep& run, const StepOutcome& outcome) {
  if (!options_.probe || !rerunnable(run) || run.context.averager || run.evaluations.failed > 0) return {};
  std::vector<size_t> nonfinite;
  if (outcome.micro_losses.empty()) {
    if (run.micro_batches.size() == 1) nonfinite.push_back(0);
  } else if (outcome.micro_losses.size() == run.micro_batches.size()) {
    for (size_t k = 0; k < outcome.micro_losses.size(); ++k)
      if (!std::isfinite(outcome.micro_losses[k])) nonfinite.push_back(k);
  }
  if (nonfinite.empty()) return {};
  decide_micro_batches(run);  // the batch each loss was computed on
  // The step's gradients stand aside while each re-run makes its own, and
  // come back as they were; so do the loop's random generators.
  std::vector<at::Tensor> step_gradients;
  for (const at::Tensor& p : parameters_) step_gradients.push_back(p.grad());
  const KeepGeneratorStates loop_generators;
  bool all_add_nothing = true;
  for (size_t k : nonfinite) {
    try {
      const StepRecomputation alone = rerun_as_the_step_ran(run, {run.micro_batches[k]}, 1.0);
      all_add_nothing = !std::isfinite(alone.loss.item<double>()) && gradients_all_zero(parameters_);
    } catch (const std::exception&) {
      all_add_nothing = false;  // the failed step's forensics meet the error again and say it
    }
    if (!all_add_nothing) break;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor param = parameters_[i];
    param.mutable_grad() = step_gradients[i];
  }
  return all_add_nothing ? nonfinite : std::vector<size_t>{};
}

}  // namespace nanscope
