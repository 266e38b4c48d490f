#include "nanscope/core/recovery_words.hpp"

#include <sstream>
#include <vector>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/core/kernel_switch.hpp"

namespace nanscope {

namespace {

std::string rollbacks_text(int64_t n) { return std::to_string(n) + " rollback(s)"; }

// An option as whoever ran the loop sets it (a flag, a keyword, a field).
std::string option_text(const char* name, const RecoveryState& state) {
  const GuardOption* option = find_guard_option(name);
  return option ? spelled(*option, spelling_of(state.origin)) : name;
}

// Why no rollback saves a sick state, with rollback on: the rollbacks are
// used up, or no healthy state was kept before the trouble (a run that
// breaks its weights early, before the first state is kept).
std::string no_rollback_text(const RecoveryState& state) {
  if (!state.rollback_left) return " and every rollback allowed is used (" + option_text("max_rollbacks", state) + ")";
  return " and no healthy state was kept before the trouble to roll back to (one is kept every " +
         option_text("rollback_every", state) + " healthy steps)";
}

// Worded from this step's own capture: the earlier step's rows are not this
// one's (its diagnosis's why is that step's measurement).
std::string same_birth_text(const StepFacts& facts) {
  const std::string where = facts.birth_where.empty() ? "" : ", here in " + facts.birth_where;
  const std::string again = "again (as step " + std::to_string(facts.same_birth_step) + ")";
  const Remedy earlier = facts.same_birth_as ? facts.same_birth_as->remedy : Remedy::none;
  if (earlier == Remedy::skip_data)
    return again + ": the same first birth and sample" + where + " (a data fault); no fallback";
  if (earlier == Remedy::skip_model_or_data)
    return again + ": the same first birth and trigger sample" + where +
           " (an unsafe op, non-finite at full precision too); no fallback";
  if (earlier == Remedy::kernel)
    return "the same first birth as step " + std::to_string(facts.same_birth_step) + where + ", with " +
           format::to_string(facts.same_birth_as->kernel) + " pinned";
  const std::vector<std::string> none;
  return "the same first birth as step " + std::to_string(facts.same_birth_step) + where + ", with " +
         fp32_modules_flag_value(facts.same_birth_as ? facts.same_birth_as->modules : none) + " in fp32";
}

// Where the `kernel` remedy's pin holds (RecoveryMemory::pin_kernel's rule).
std::string pinned_where(const RemedyChoice& choice) {
  const std::string module = choice.modules.empty() ? "" : choice.modules.front();
  return pinned_in_module(choice.kernel, module) ? "in " + module : "process-wide";
}

std::string diagnosed_text(const RecoveryPlan& plan, const StepFacts& facts, const RecoveryState& state) {
  const RemedyChoice& choice = *plan.diagnosis;
  switch (plan.action) {
    case RecoveryAction::fp32_modules: {
      std::ostringstream cost;
      cost.precision(3);
      cost << "; a re-run of the step: " << choice.seconds_before * 1e3 << " ms -> " << choice.seconds_after * 1e3
           << " ms (x" << (choice.seconds_before > 0 ? choice.seconds_after / choice.seconds_before : 1.0) << ")";
      return fp32_modules_flag_value(choice.modules) + " now in fp32 (" + choice.why + "), the rest stays " +
             precision_name(facts.amp) + cost.str();
    }
    case RecoveryAction::pin_kernel:
      return std::string(format::to_string(choice.kernel)) + " now pinned " + pinned_where(choice) +
             " for the rest of the run (" + choice.why + "), no fallback; in your own code: " +
             (choice.kernel_trials ? format::kernel_pin_code(choice.kernel, *choice.kernel_trials, state.origin) : "");
    case RecoveryAction::whole_fallback: return choice.why;
    default: return choice.why + "; no fallback";
  }
}

// The widest precision the run got to: fp32, or a model's own 16-bit
// weights, which no fallback widens.
std::string widest_precision_text(const StepFacts& facts) {
  return facts.own_16bit.empty() ? "at fp32" : "in the model's own " + facts.own_16bit + " weights";
}

// A run of non-finite steps that outlasted everything there was to try.
std::string dead_run_text(const StepFacts& facts, const RecoveryState& state) {
  const std::string tried =
      (state.fallback_fired     ? (facts.own_16bit.empty() ? "after the fp32 fallback"
                                                           : "after the fallback's LR cut, " + widest_precision_text(facts))
       : facts.amp == Amp::fp32 ? widest_precision_text(facts)
                                : std::string("fallback off")) +
      (!state.rollback_enabled ? ", rollback off"
       : state.rollbacks > 0   ? ", no rollback left"
                               : ", no good state to roll back to");
  const int64_t since = state.nonfinite_in_a_row > 0 ? state.nonfinite_since : state.step;
  return "non-finite on " + std::to_string(state.nonfinite_in_a_row + 1) +
         " steps in a row; the trouble began at step " + std::to_string(since) + " (" + tried + "): the run stops";
}

}  // namespace

RecoveryWords recovery_words(const RecoveryPlan& plan, const StepFacts& facts, const RecoveryState& state) {
  RecoveryWords w;
  w.subject = facts.what;
  switch (plan.reason) {
    case RecoveryReason::stock_skip:
      if (state.scaler_enabled) w.why = ", loss scale " + number_text(state.loss_scale);
      break;
    case RecoveryReason::written_outside: w.why = "; the buffers from before those calls are back, no fallback"; break;
    case RecoveryReason::broken_state:
      if (plan.action == RecoveryAction::roll_back)
        w.subject = facts.broken_state;
      else
        w.why = facts.broken_state + "; skipping cannot save them" +
                (state.rollback_enabled ? no_rollback_text(state) : "") + ": the run stops";
      break;
    case RecoveryReason::remedies_did_not_hold:
      w.why = std::to_string(state.nonfinite_in_a_row + 1) + " non-finite steps in a row";
      break;
    case RecoveryReason::same_birth_again: w.why = same_birth_text(facts); break;
    case RecoveryReason::no_loss_fn: w.why = "no loss function to diagnose the step with"; break;
    case RecoveryReason::diagnosed: w.why = diagnosed_text(plan, facts, state); break;
    case RecoveryReason::no_rank_diagnosed: w.why = "no rank diagnosed the step"; break;
    case RecoveryReason::trouble_quiet: w.subject.clear(); break;  // the step's own line is said
    case RecoveryReason::trouble_fallback:
      if (state.rollbacks > 0) w.subject += " after " + rollbacks_text(state.rollbacks);
      break;
    case RecoveryReason::trouble_unstable:
      // No fallback left: it fired, the run is at fp32 already, or it is off (then the run is still below fp32).
      w.why = facts.what + " after " + rollbacks_text(state.rollbacks) + " and " +
              (state.fallback_fired || facts.amp == Amp::fp32
                   ? widest_precision_text(facts)
                   : std::string("at ") + precision_name(facts.amp) + " with the fallback off") +
              ": the model itself is unstable; the run stops";
      break;
    case RecoveryReason::rollback_not_everywhere:
      w.why = facts.what + "; a rollback was due, but not every rank holds a good state to go back to: the run stops";
      break;
    case RecoveryReason::stock_fallback:
    case RecoveryReason::no_say:
    case RecoveryReason::replayed:
    case RecoveryReason::trouble_rollback: break;
  }
  // Several ranks: a remedy's words name the rank whose diagnosis it is (a stock skip's are a loss scale).
  if (facts.diagnosed_on_rank >= 0 && plan.remedy != Remedy::none)
    w.why = "rank " + std::to_string(facts.diagnosed_on_rank) + ": " + w.why;
  if (plan.then_stop) w.then_stop = dead_run_text(facts, state);
  return w;
}

}  // namespace nanscope
