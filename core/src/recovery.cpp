#include "nanscope/core/recovery.hpp"

#include <sstream>

#include "nanscope/common/number_text.hpp"

namespace nanscope {

namespace {

RecoveryPlan make(RecoveryAction action, std::string subject, std::string why, Remedy remedy = Remedy::none) {
  RecoveryPlan r;
  r.action = action;
  r.subject = std::move(subject);
  r.why = std::move(why);
  r.remedy = remedy;
  return r;
}

std::string rollbacks_text(int64_t n) { return std::to_string(n) + " rollback(s)"; }

// The fallback could still be tried at some later step.
bool fallback_left(const StepFacts& facts, const RecoveryState& state) {
  return state.mode != FallbackMode::off && !state.fallback_fired && facts.amp != Amp::fp32;
}

bool rollback_possible(const RecoveryState& state) {
  return state.rollback_enabled && state.rollback_left && state.good_state_saved;
}

// --fallback auto: the remedy the step's diagnosis supports, or the whole
// fallback where none can be trusted.
RecoveryPlan automatic_remedy(const StepFacts& facts, const RecoveryState& state,
                              const std::function<RemedyChoice()>& diagnose) {
  auto whole = [&](const std::string& why) {
    return make(RecoveryAction::whole_fallback, facts.what, why, Remedy::whole_fp32);
  };
  // A remedy that did not hold: non-finite step after step.
  if (state.max_nonfinite_run > 0 && state.nonfinite_in_a_row + 1 >= state.max_nonfinite_run)
    return whole(std::to_string(state.nonfinite_in_a_row + 1) + " non-finite steps in a row");
  // The same first birth as an earlier diagnosis: data again is skipped
  // again; after its modules went to fp32 it means they were not enough.
  if (facts.same_birth_as) {
    const RemedyChoice& earlier = *facts.same_birth_as;
    // Worded from this step's own capture: the earlier step's rows are not
    // this one's (its why is that step's measurement).
    const std::string same = "the same first birth as step " + std::to_string(facts.same_birth_step) +
                             (facts.birth_where.empty() ? "" : ", here in " + facts.birth_where);
    if (earlier.remedy == Remedy::skip_data)
      return make(RecoveryAction::skip_data, facts.what,
                  same + " (a data fault at step " + std::to_string(facts.same_birth_step) + "); no fallback",
                  Remedy::skip_data);
    return whole(same + ", with " + fp32_modules_flag_value(earlier.modules) + " in fp32");
  }
  if (!facts.rerunnable) return whole("no loss function to diagnose the step with");

  const RemedyChoice choice = diagnose();
  RecoveryPlan r;
  if (choice.no_say) {
    r = make(RecoveryAction::skip, facts.what, "");
    r.no_say = true;
    return r;
  }
  switch (choice.remedy) {
    case Remedy::skip_data:
    case Remedy::skip_transient:
    case Remedy::skip_compiler:
    case Remedy::skip_undiagnosed: {
      const RecoveryAction skip = choice.remedy == Remedy::skip_data        ? RecoveryAction::skip_data
                                  : choice.remedy == Remedy::skip_transient ? RecoveryAction::skip_transient
                                  : choice.remedy == Remedy::skip_compiler  ? RecoveryAction::skip_compiler
                                                                            : RecoveryAction::skip_undiagnosed;
      r = make(skip, facts.what, choice.why + "; no fallback", choice.remedy);
      break;
    }
    case Remedy::fp32_modules: {
      std::ostringstream cost;
      cost.precision(3);
      cost << "; a re-run of the step: " << choice.seconds_before * 1e3 << " ms -> " << choice.seconds_after * 1e3
           << " ms (x" << (choice.seconds_before > 0 ? choice.seconds_after / choice.seconds_before : 1.0) << ")";
      r = make(RecoveryAction::fp32_modules, facts.what,
               fp32_modules_flag_value(choice.modules) + " now in fp32 (" + choice.why + "), the rest stays " +
                   precision_name(facts.amp) + cost.str(),
               choice.remedy);
      r.modules = choice.modules;
      break;
    }
    case Remedy::none:
    case Remedy::whole_fp32:
    case Remedy::unknown: r = whole(choice.why); break;
  }
  r.diagnosis = choice;
  return r;
}

RecoveryPlan on_nonfinite_step(const StepFacts& facts, const RecoveryState& state,
                               const std::function<RemedyChoice()>& diagnose) {
  // Not this step's fault, nor a precision problem: the skip put back the
  // buffers from before those calls, and the run trains on.
  if (facts.buffers_written_outside) {
    RecoveryPlan r =
        make(RecoveryAction::skip, facts.what, "; the buffers from before those calls are back, no fallback");
    r.counted = false;
    return r;
  }
  // A skip saves the model only if its state is intact: non-finite weights
  // (or buffers, or optimizer state) make every later step non-finite, and
  // skipping would go on for ever.
  if (!facts.state_finite) {
    if (rollback_possible(state)) return make(RecoveryAction::roll_back, facts.broken_state, "");
    return make(RecoveryAction::stop, facts.what,
                facts.broken_state + "; skipping cannot save them" +
                    (state.rollback_enabled ? " and no rollback is left" : "") + ": the run stops");
  }
  RecoveryPlan r;
  if (fallback_due(facts, state))
    r = state.mode == FallbackMode::automatic ? automatic_remedy(facts, state, diagnose)
                                              : make(RecoveryAction::whole_fallback, facts.what, "");
  else
    r = make(RecoveryAction::skip, facts.what,
             state.scaler_enabled ? ", loss scale " + number_text(state.loss_scale) : std::string());

  // Finite weights can still be wrecked (a burst of huge samples through SGD
  // without clipping): every later step overflows and is skipped. A step
  // that tried something new is not the end; one that only skipped, with
  // neither the fallback nor a rollback left, after max_nonfinite_run such
  // steps in a row, is a dead run.
  const int64_t in_a_row = state.nonfinite_in_a_row + 1;
  const bool nothing_new = r.action != RecoveryAction::whole_fallback && r.action != RecoveryAction::fp32_modules;
  if (nothing_new && state.max_nonfinite_run > 0 && in_a_row >= state.max_nonfinite_run &&
      !fallback_left(facts, state) && !rollback_possible(state)) {
    const std::string tried = std::string(state.fallback_fired     ? "after the fp32 fallback"
                                          : facts.amp == Amp::fp32 ? "at fp32"
                                                                   : "fallback off") +
                              (!state.rollback_enabled ? ", rollback off"
                               : state.rollbacks > 0   ? ", no rollback left"
                                                       : ", no good state to roll back to");
    const int64_t since = state.nonfinite_in_a_row > 0 ? state.nonfinite_since : state.step;
    r.then_stop = "non-finite on " + std::to_string(in_a_row) + " steps in a row; the trouble began at step " +
                  std::to_string(since) + " (" + tried + "): the run stops";
  }
  return r;
}

RecoveryPlan on_persisting_trouble(const StepFacts& facts, const RecoveryState& state) {
  // The step's own line is said: nothing more to say.
  if (!state.rollback_enabled) return make(RecoveryAction::skip, "", "");  // the stock loop: skip, go on
  if (rollback_possible(state)) return make(RecoveryAction::roll_back, facts.what, "");
  if (fallback_left(facts, state))
    return make(RecoveryAction::whole_fallback,
                facts.what + (state.rollbacks > 0 ? " after " + rollbacks_text(state.rollbacks) : ""), "");
  // With no rollback tried (no good state saved yet) nothing has failed but
  // the step itself: the stock loop skips and goes on.
  if (state.rollbacks == 0) return make(RecoveryAction::skip, "", "");
  return make(RecoveryAction::stop, facts.what,
              facts.what + " after " + rollbacks_text(state.rollbacks) +
                  " and at fp32: the model itself is unstable; the run stops");
}

}  // namespace

int plan_strength(const RecoveryPlan& plan) {
  if (plan.no_say) return 0;
  switch (plan.action) {
    case RecoveryAction::skip: return 1;
    case RecoveryAction::skip_transient: return 2;
    case RecoveryAction::skip_compiler: return 3;
    case RecoveryAction::skip_undiagnosed: return 4;
    case RecoveryAction::skip_data: return 5;
    case RecoveryAction::fp32_modules: return 6;
    case RecoveryAction::whole_fallback: return 7;
    case RecoveryAction::roll_back: return 8;
    case RecoveryAction::stop: return 9;
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

RecoveryPlan decide_recovery(const StepFacts& facts, const RecoveryState& state,
                             const std::function<RemedyChoice()>& diagnose) {
  return facts.trigger == RecoveryTrigger::persisting_trouble ? on_persisting_trouble(facts, state)
                                                              : on_nonfinite_step(facts, state, diagnose);
}

}  // namespace nanscope
