#include "nanscope/core/recovery.hpp"

#include <stdexcept>

namespace nanscope {

namespace {

RecoveryPlan make(RecoveryAction action, RecoveryReason reason, Remedy remedy = Remedy::none) {
  RecoveryPlan r;
  r.action = action;
  r.reason = reason;
  r.remedy = remedy;
  return r;
}

// The fallback could still be tried at some later step.
bool fallback_left(const StepFacts& facts, const RecoveryState& state) {
  return state.mode != FallbackMode::off && !state.fallback_fired && facts.amp != Amp::fp32;
}

bool rollback_possible(const RecoveryState& state) { return replay_possible(state) && state.good_state_saved; }

// --fallback auto's first rules, which need no diagnosis: a remedy that did
// not hold (non-finite step after step), the same first birth as an earlier
// diagnosis (data again is skipped again; after its modules went to fp32 it
// means they were not enough), or nothing to diagnose with.
std::optional<RecoveryPlan> remedy_without_diagnosis(const StepFacts& facts, const RecoveryState& state) {
  if (state.max_nonfinite_run > 0 && state.nonfinite_in_a_row + 1 >= state.max_nonfinite_run)
    return make(RecoveryAction::whole_fallback, RecoveryReason::remedies_did_not_hold, Remedy::whole_fp32);
  if (facts.same_birth_as) {
    // The same fault again is skipped as it was. A data fault explains
    // itself and escalates nothing; an ordinary sample that fails again may
    // be failing because the model changed under it (an earlier update that
    // wrecked the weights), so it stays trouble the rollback policy counts.
    const Remedy earlier = facts.same_birth_as->remedy;
    if (earlier == Remedy::skip_data || earlier == Remedy::skip_model_or_data) {
      RecoveryPlan r =
          make(earlier == Remedy::skip_data ? RecoveryAction::skip_data : RecoveryAction::skip_model_or_data,
               RecoveryReason::same_birth_again, earlier);
      r.counted = earlier != Remedy::skip_data;
      return r;
    }
    // Its modules went to fp32 and it failed again: they were not enough.
    return make(RecoveryAction::whole_fallback, RecoveryReason::same_birth_again, Remedy::whole_fp32);
  }
  if (!facts.rerunnable) return make(RecoveryAction::whole_fallback, RecoveryReason::no_loss_fn, Remedy::whole_fp32);
  return std::nullopt;
}

// --fallback auto: the remedy the step's diagnosis supports, or the whole
// fallback where none can be trusted.
RecoveryPlan diagnosed_remedy(const RemedyChoice& choice) {
  if (choice.no_say) {
    RecoveryPlan r = make(RecoveryAction::skip, RecoveryReason::no_say);
    r.no_say = true;
    return r;
  }
  RecoveryAction action = RecoveryAction::whole_fallback;
  switch (choice.remedy) {
    case Remedy::skip_data: action = RecoveryAction::skip_data; break;
    case Remedy::skip_transient: action = RecoveryAction::skip_transient; break;
    case Remedy::skip_compiler: action = RecoveryAction::skip_compiler; break;
    case Remedy::skip_undiagnosed: action = RecoveryAction::skip_undiagnosed; break;
    case Remedy::skip_model_or_data: action = RecoveryAction::skip_model_or_data; break;
    case Remedy::fp32_modules: action = RecoveryAction::fp32_modules; break;
    case Remedy::kernel: action = RecoveryAction::pin_kernel; break;
    case Remedy::none:
    case Remedy::whole_fp32:
    case Remedy::unknown: break;
  }
  RecoveryPlan r = make(action, RecoveryReason::diagnosed,
                        action == RecoveryAction::whole_fallback ? Remedy::whole_fp32 : choice.remedy);
  if (action == RecoveryAction::fp32_modules || action == RecoveryAction::pin_kernel) r.modules = choice.modules;
  if (action == RecoveryAction::pin_kernel) r.kernel = choice.kernel;
  r.diagnosis = choice;
  return r;
}

// nullopt: the decision needs the step's diagnosis, and the facts lack it.
std::optional<RecoveryPlan> automatic_remedy(const StepFacts& facts, const RecoveryState& state) {
  if (std::optional<RecoveryPlan> r = remedy_without_diagnosis(facts, state)) return r;
  if (!facts.diagnosis) return std::nullopt;
  return diagnosed_remedy(*facts.diagnosis);
}

// Finite weights can still be wrecked (a burst of huge samples through SGD
// without clipping): every later step overflows and is skipped. A step that
// tried something new is not the end; one that only skipped, with neither
// the fallback nor a rollback left, after max_nonfinite_run such steps in a
// row, is a dead run.
bool run_is_dead(const RecoveryPlan& r, const StepFacts& facts, const RecoveryState& state) {
  const bool nothing_new = r.action != RecoveryAction::whole_fallback && r.action != RecoveryAction::fp32_modules &&
                           r.action != RecoveryAction::pin_kernel;
  return nothing_new && r.counted && state.max_nonfinite_run > 0 &&
         state.nonfinite_in_a_row + 1 >= state.max_nonfinite_run && !fallback_left(facts, state) &&
         !rollback_possible(state);
}

// nullopt: the decision needs the step's diagnosis, and the facts lack it.
std::optional<RecoveryPlan> on_nonfinite_step(const StepFacts& facts, const RecoveryState& state) {
  // The run replayed without the update that doomed this step survives: it
  // goes on from there (the cause is known and gone).
  if (facts.replay_without_survives && replay_possible(state))
    return make(RecoveryAction::replay_without, RecoveryReason::replayed);
  // Not this step's fault, nor a precision problem: the skip put back the
  // buffers from before those calls, and the run trains on.
  if (facts.buffers_written_outside) {
    RecoveryPlan r = make(RecoveryAction::skip, RecoveryReason::written_outside);
    r.counted = false;
    return r;
  }
  // A skip saves the model only if its state is intact: non-finite weights
  // (or buffers, or optimizer state) make every later step non-finite, and
  // skipping would go on for ever.
  if (!facts.state_finite)
    return make(rollback_possible(state) ? RecoveryAction::roll_back : RecoveryAction::stop,
                RecoveryReason::broken_state);
  std::optional<RecoveryPlan> r = !fallback_due(facts, state) ? make(RecoveryAction::skip, RecoveryReason::stock_skip)
                                  : state.mode == FallbackMode::automatic
                                      ? automatic_remedy(facts, state)
                                      : make(RecoveryAction::whole_fallback, RecoveryReason::stock_fallback);
  if (r) r->then_stop = run_is_dead(*r, facts, state);
  return r;
}

RecoveryPlan on_persisting_trouble(const StepFacts& facts, const RecoveryState& state) {
  if (!state.rollback_enabled) return make(RecoveryAction::skip, RecoveryReason::trouble_quiet);  // the stock loop
  if (rollback_possible(state)) return make(RecoveryAction::roll_back, RecoveryReason::trouble_rollback);
  if (fallback_left(facts, state)) return make(RecoveryAction::whole_fallback, RecoveryReason::trouble_fallback);
  // With no rollback tried (no good state saved yet) nothing has failed but
  // the step itself: the stock loop skips and goes on.
  if (state.rollbacks == 0) return make(RecoveryAction::skip, RecoveryReason::trouble_quiet);
  return make(RecoveryAction::stop, RecoveryReason::trouble_unstable);
}

}  // namespace

int plan_strength(const RecoveryPlan& plan) {
  if (plan.no_say) return 0;
  switch (plan.action) {
    case RecoveryAction::skip: return 1;
    case RecoveryAction::skip_transient: return 2;
    case RecoveryAction::skip_compiler: return 3;
    case RecoveryAction::skip_undiagnosed: return 4;
    case RecoveryAction::skip_model_or_data: return 5;
    case RecoveryAction::skip_data: return 6;
    case RecoveryAction::pin_kernel: return 7;
    case RecoveryAction::fp32_modules: return 8;
    case RecoveryAction::whole_fallback: return 9;
    case RecoveryAction::replay_without: return 10;
    case RecoveryAction::roll_back: return 11;
    case RecoveryAction::stop: return 12;
    case RecoveryAction::unknown: break;
  }
  return 0;
}

bool fallback_due(const StepFacts& facts, const RecoveryState& state) {
  if (state.mode == FallbackMode::off || state.fallback_fired) return false;
  const bool scaler_handles_it = facts.amp == Amp::fp16 && facts.loss_finite && state.scaler_enabled &&
                                 state.loss_scale >= state.fallback_min_scale;
  return !scaler_handles_it;
}

bool replay_possible(const RecoveryState& state) { return state.rollback_enabled && state.rollback_left; }

bool needs_diagnosis(const StepFacts& facts, const RecoveryState& state) {
  return facts.trigger == RecoveryTrigger::nonfinite_step && !on_nonfinite_step(facts, state);
}

RecoveryPlan decide_recovery(const StepFacts& facts, const RecoveryState& state) {
  std::optional<RecoveryPlan> plan = facts.trigger == RecoveryTrigger::persisting_trouble
                                         ? on_persisting_trouble(facts, state)
                                         : on_nonfinite_step(facts, state);
  if (!plan) throw std::logic_error("decide_recovery: the decision needs the step's diagnosis (needs_diagnosis)");
  plan->trigger = facts.trigger;
  return *plan;
}

}  // namespace nanscope
