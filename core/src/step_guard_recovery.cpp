// StepGuard's recovery: the rollback to a saved good state, the whole-model
// fp32 fallback, the states saved for them, and the stop of a run nothing can
// save.
#include "nanscope/core/step_guard.hpp"

#include <limits>
#include <string>
#include <vector>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/event_text.hpp"

namespace nanscope {

// Finite weights can still be wrecked (a burst of huge samples through SGD
// without clipping): every later step overflows and is skipped. Once neither
// the fallback nor a rollback is left to try, a long run of non-finite steps
// is a dead run, and it stops rather than skip to the end.
void StepGuard::stop_if_nothing_left_to_try(int64_t step) {
  if (options_.max_nonfinite_run <= 0 || nonfinite_in_a_row_ < options_.max_nonfinite_run) return;
  if (fallback_.available(amp_)) return;
  if (options_.rollback.enabled && rollback_.can_roll_back() && ring_.size() > 0) return;
  const std::string tried = std::string(fallback_.fired()   ? "after the fp32 fallback"
                                        : amp_ == Amp::fp32 ? "at fp32"
                                                            : "fallback off") +
                            (!options_.rollback.enabled  ? ", rollback off"
                             : rollback_.rollbacks() > 0 ? ", no rollback left"
                                                         : ", no good state to roll back to");
  stop_dead_run(step, "non-finite on " + std::to_string(nonfinite_in_a_row_) +
                          " steps in a row; the trouble began at step " + std::to_string(nonfinite_since_) + " (" +
                          tried + "): the run stops");
}

void StepGuard::fall_back(int64_t step, GuardedStep& result, const std::string& what) {
  fallback_.fire(model_, optimizer_, scaler_, parameters_.front().device(), step);
  result.fell_back = true;
  // A run already in fp32 has no wider precision to go to: its fallback is the LR cut alone.
  const std::string lr_cut = "LR x " + number_text(options_.lr_backoff);
  journal_.record(step, format::EventKind::fallback,
                  result.amp == Amp::fp32 ? "fp32: " + lr_cut + " (already fp32: no wider precision to fall back to)"
                                          : std::string(precision_name(result.amp)) + " -> fp32, " + lr_cut,
                  what + " at " + precision_name(result.amp) + " -> skipped; fallback ");
  amp_ = Amp::fp32;
}

void StepGuard::stop_dead_run(int64_t step, const std::string& text) {
  journal_.record(step, format::EventKind::stop, text);
  journal_.flush();
  stopped_ = "step " + std::to_string(step) + ": " + text;
  throw DeadRunError(stopped_);
}

void StepGuard::refuse_if_stopped() const {
  // A loop that misses the stop would otherwise pay a forensic re-run on
  // every later step of a run nothing can save.
  if (!stopped_.empty())
    throw DeadRunError("the guard stopped the run at " + stopped_ +
                       " (no further step: end the loop, or start again from a healthy checkpoint)");
}

void StepGuard::save_state_if_due(int64_t step) {
  if (!rollback_.wants_state(step)) return;
  // A sick state is never kept: a rollback to it would restore the sickness.
  if (const StateHealth health = this->health(); !health.finite()) {
    journal_.record(
        step, format::EventKind::save_refused,
        "rollback state after step " + std::to_string(step) + " not kept: " + health.text() + " non-finite");
    return;
  }
  if (!ring_.save(step, model_, optimizer_, scaler_) && ring_.size() == 0 && ring_.max_states() > 0) {
    // One state is over the memory budget: say so once, and stop trying.
    journal_.say(step, "rollback: one saved state is larger than the " + number_text(options_.rollback.memory_mb) +
                           " MB budget (--rollback-memory); no rollback possible");
    ring_ = StateRing(0, 0);
  }
}

void StepGuard::act_on_persisting_trouble(int64_t step, GuardedStep& result, const std::string& why) {
  if (!options_.rollback.enabled) return;  // the stock loop: skip and go on
  if (rollback_.can_roll_back() && roll_back(step, result, why)) return;
  rollback_.escalated();
  if (fallback_.available(amp_)) {
    fall_back(
        step, result,
        why + (rollback_.rollbacks() > 0 ? " after " + std::to_string(rollback_.rollbacks()) + " rollback(s)" : ""));
    journal_.flush();
    return;
  }
  // With no rollback tried (no good state saved yet) nothing has failed but
  // the step itself: the stock loop skips and goes on.
  if (rollback_.rollbacks() == 0) return;
  stop_dead_run(step, why + " after " + std::to_string(rollback_.rollbacks()) +
                          " rollback(s) and at fp32: the model itself is unstable; the run stops");
}

bool StepGuard::roll_back(int64_t step, GuardedStep& result, const std::string& why) {
  const TrainingState* state = ring_.newest_before(rollback_.trouble_began());
  if (!state) return false;
  const int64_t to = state->step;
  // The groups' LR is the loop's: restored as it was, the cut is the guard's multiplier.
  std::vector<double> lrs;
  for (const auto& group : optimizer_.param_groups()) lrs.push_back(group.options().get_lr());
  const bool scaling = scaler_.enabled();
  StateRing::restore(*state, model_, optimizer_, scaler_);
  if (!scaling) scaler_.disable();  // the fp32 fallback stays
  for (size_t i = 0; i < lrs.size(); ++i) optimizer_.param_groups()[i].options().set_lr(lrs[i]);
  rollback_lr_multiplier_ *= options_.lr_backoff;
  clear_grads(parameters_);
  ring_.forget_from(to + 1);
  history_.forget_from(to + 1);
  doom_found_.reset();
  rollback_.rolled_back(step);
  last_applied_step_ = to;
  result.rolled_back_to = to;
  const std::string text =
      format::rollback_text({to, step, options_.lr_backoff, lrs.empty() ? 0.0 : lrs.front() * lr_multiplier(), why});
  journal_.record(step, format::EventKind::rollback, text, "rollback ");
  journal_.flush();
  nonfinite_in_a_row_ = 0;
  return true;
}

}  // namespace nanscope
