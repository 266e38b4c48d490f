// StepGuard's recovery: the one place a decided action is carried out (the
// skips, the modules to fp32, the whole-model fallback, the replay without a
// dooming update, the rollback to a saved good state, the stop), the states
// saved for them, and the ranks' agreement on one plan.
#include "failed/recovery_actions.hpp"

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "failed/lockstep_reruns.hpp"
#include "failed/plan_values.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/event_text.hpp"

namespace nanscope {

RecoveryActions::RecoveryActions(const GuardOptions& options, Steered& steered, LossScaler& scaler,
                                 const std::vector<at::Tensor>& parameters, Journal& journal,
                                 ForensicsMemory& forensics, DoomMemory& doom)
    : options_(options),
      steered_(steered),
      scaler_(scaler),
      parameters_(parameters),
      journal_(journal),
      forensics_(forensics),
      doom_(doom),
      memory_(options) {}

void RecoveryActions::fall_back(const RunningStep& run, const std::string& what) {
  const int64_t step = run.step;
  const bool in_fp32 = memory_.fall_back(steered_.model, steered_.optimizer, scaler_, device(), step);
  // A run already in fp32, or a model that keeps its own 16-bit weights, has
  // no wider precision to go to: its fallback is the LR cut alone.
  const std::string lr_cut = "LR x " + number_text(options_.lr_backoff);
  const std::string at = step_precision_name(run.amp, steered_.model.own_16bit_type_name());
  std::string text = at + " -> fp32, " + lr_cut;
  if (!in_fp32)
    text = at + ": " + lr_cut + " (the model's own " + steered_.model.own_float_type_name() +
           " weights stay: widen them yourself for fp32)";
  else if (run.amp == Amp::fp32)
    text = "fp32: " + lr_cut + " (already fp32: no wider precision to fall back to)";
  journal_.record(step, format::EventKind::fallback, text,
                  what + " at " + at + (!run.outcome.skipped ? " -> fallback " : " -> skipped; fallback "));
}

void RecoveryActions::stop(int64_t step, const std::string& text) {
  journal_.record(step, format::EventKind::stop, text);
  journal_.flush();
  stopped_ = "step " + std::to_string(step) + ": " + text;
}

void RecoveryActions::stop_dead_run(int64_t step, const std::string& text) {
  stop(step, text);
  throw DeadRunError(stopped_);
}

void RecoveryActions::save_state_if_due(int64_t step, GradientAverager* ranks) {
  if (!memory_.rollback().wants_state(step)) return;
  // A sharded model's state is kept by every rank or by none (each rank's
  // budget meets its own shards).
  const bool sharded = ranks && ranks->sharded();
  // A sick state is never kept: a rollback to it would restore the sickness.
  const StateHealth health = state_health(steered_.model, &steered_.optimizer);
  if (!finite_on_every_rank(health, ranks)) {
    journal_.record(step, format::EventKind::save_refused,
                    "rollback state after step " + std::to_string(step) + " not kept: " +
                        (health.finite() ? std::string("another rank's shards") : health.text()) + " non-finite");
    return;
  }
  bool saved = memory_.save(step, steered_.model, steered_.optimizer, scaler_);
  if (sharded && !ranks->every_rank(saved)) {
    memory_.forget_saved_from(step);
    saved = false;
  }
  const StateRing& ring = memory_.saved_states();
  if (!saved && ring.size() == 0 && ring.max_states() > 0) {
    // One state is over the memory budget: say so once, and stop trying.
    journal_.say(step, "rollback: one saved state is larger than the " + number_text(options_.rollback.memory_mb) +
                           " MB budget (--rollback-memory" + (sharded ? ", on some rank" : "") +
                           "); no rollback possible");
    memory_.stop_saving();
  }
}

void RecoveryActions::go_back_to(const TrainingState& state, bool with_scaler) {
  // The groups' LR is the loop's (a saved optimizer state carries the LR of
  // its step): it stays as the loop set it; the guard's cut is its own (lr_cut).
  const GroupLrScope loop_lrs(steered_.optimizer);
  LossScaler unchanged = scaler_;
  const bool scaling = scaler_.enabled();
  StateRing::restore(state, steered_.model, steered_.optimizer, with_scaler ? scaler_ : unchanged);
  if (!scaling) scaler_.disable();  // the fp32 fallback stays
  clear_grads(parameters_);
}

bool finite_on_every_rank(const StateHealth& local, GradientAverager* ranks) {
  // Sick if any rank's is, so that every rank acts alike (one all-reduce, on every rank).
  return ranks && ranks->sharded() ? ranks->every_rank(local.finite()) : local.finite();
}

RecoveryState RecoveryActions::state_at(int64_t step) const {
  RecoveryState s;
  const RollbackPolicy& rollback = memory_.rollback();
  s.mode = memory_.fallback().mode();
  s.fallback_fired = memory_.fallback().fired();
  s.scaler_enabled = scaler_.enabled();
  s.loss_scale = scaler_.scale();
  s.fallback_min_scale = options_.fallback_min_scale;
  s.rollback_enabled = options_.rollback.enabled;
  s.rollback_left = rollback.can_roll_back();
  s.good_state_saved = memory_.rollback_target() != nullptr;
  s.rollbacks = rollback.rollbacks();
  s.nonfinite_in_a_row = memory_.nonfinite_in_a_row();
  s.nonfinite_since = memory_.nonfinite_since();
  s.max_nonfinite_run = options_.max_nonfinite_run;
  s.step = step;
  s.origin = options_.origin;
  return s;
}

// The one place a recovery is carried out: only here do the precision, the
// modules in fp32, the LR cut and the saved states change for a failed step.
RecoveryDone RecoveryActions::apply(const RunningStep& run, const RecoveryPlan& r, const RecoveryWords& w,
                                    DoomSearchResult* doom, HeldLiveState* held, const std::string& birth) {
  const int64_t step = run.step;
  // The doom search's replay stands only as this action; else the live state is back.
  if (held && held->held()) {
    if (r.action != RecoveryAction::replay_without) go_back_to(held->state(), /*with_scaler=*/false);
    held->release();
  }
  RecoveryDone done;
  const std::string remedy_text = std::string(remedy_name(r.remedy)) + ": " + w.why;
  // A remedy that is the step's whole outcome: its event and its line in one.
  auto remedy_record = [&] {
    done.remedy = r.remedy;
    journal_.record(step, format::EventKind::remedy, remedy_text, w.subject + " -> skipped; ");
  };
  switch (r.action) {
    case RecoveryAction::skip:
      if (!w.subject.empty()) journal_.say(step, w.subject + " -> skipped" + w.why);
      break;
    case RecoveryAction::skip_data:
    case RecoveryAction::skip_transient:
    case RecoveryAction::skip_compiler:
    case RecoveryAction::skip_undiagnosed:
    case RecoveryAction::skip_model_or_data: remedy_record(); break;
    case RecoveryAction::fp32_modules:
      memory_.add_fp32_modules(r.modules);
      remedy_record();
      break;
    case RecoveryAction::pin_kernel:
      memory_.pin_kernel(r.modules.empty() ? std::string() : r.modules.front(), r.kernel);
      remedy_record();
      break;
    case RecoveryAction::whole_fallback:
      // The whole-model fallback's remedy event has no line: fall_back's says it.
      if (r.remedy != Remedy::none) {
        done.remedy = r.remedy;
        journal_.event(step, format::EventKind::remedy, remedy_text);
      }
      fall_back(run, w.subject);
      done.fell_back = true;
      break;
    case RecoveryAction::replay_without:
      if (!doom) throw std::logic_error("StepGuard: a replay without the dooming update was decided with no search");
      done.rolled_back_to = replay_without(step, *doom, w.subject);
      break;
    case RecoveryAction::roll_back: done.rolled_back_to = roll_back(step, w.subject); break;
    case RecoveryAction::stop: stop_dead_run(step, w.why);
    case RecoveryAction::unknown: break;
  }
  // --fallback auto: the same fault later needs no new diagnosis. An unsafe
  // op is remembered with the samples that trigger it, never without.
  if (r.diagnosis && (r.diagnosis->remedy == Remedy::skip_data || r.diagnosis->remedy == Remedy::fp32_modules ||
                      r.diagnosis->remedy == Remedy::kernel ||
                      (r.diagnosis->remedy == Remedy::skip_model_or_data && !r.diagnosis->trigger_samples.empty())))
    forensics_.remember(birth, step, *r.diagnosis);
  const bool went_back = r.action == RecoveryAction::roll_back || r.action == RecoveryAction::replay_without;
  if (r.trigger == RecoveryTrigger::persisting_trouble && !went_back) memory_.escalated();
  journal_.flush();  // a skip is exactly what a post-mortem wants on disk
  if (r.trigger == RecoveryTrigger::nonfinite_step && !went_back) {
    if (r.counted)
      memory_.count_nonfinite(step);
    else
      memory_.explained();  // the step's trouble, observed before its cause was known, is taken back
  }
  if (r.then_stop) stop_dead_run(step, w.then_stop);
  return done;
}

// The run as the doom search's replay left it: every update since the saved
// state but the dooming one (or its rows). Returns the saved state's step.
int64_t RecoveryActions::replay_without(int64_t step, DoomSearchResult& doom, const std::string& what) {
  const DoomFinding& finding = *doom.finding;
  memory_.replayed_without(finding.step, step, /*whole_update=*/finding.rows.empty());
  doom_.forget_from(finding.step);
  journal_.flush();
  journal_.say(step, what + " -> skipped; the run goes on without the update that doomed it");
  return doom.replayed_from;
}

// Several ranks decide as one process does: the rank(s) whose batch failed
// diagnosed it, the others have no say, and every rank carries out the
// strongest plan (plan_strength). The plans cross as values (plan_values.hpp)
// and each rank words the chosen one itself, from the facts of the rank that
// made it. Two collectives on a failed step (the plans' numbers, then the
// chosen one's texts); nothing on a clean one.
std::pair<RecoveryPlan, RecoveryWords> RecoveryActions::agree(GradientAverager& ranks, const RecoveryPlan& mine,
                                                              const StepFacts& facts, const RecoveryState& state) {
  const int world = ranks.world_size(), rank = ranks.rank();
  const PlanValues my_values{mine, facts};
  const std::string texts = plan_texts(my_values);
  // A row per rank; then how many ranks have a state to roll back to.
  at::Tensor plans = at::zeros({world * kPlanNumbers + 1}, at::kDouble);
  write_plan_numbers(my_values, texts.size(), plans.data_ptr<double>() + rank * kPlanNumbers);
  plans.data_ptr<double>()[world * kPlanNumbers] = memory_.rollback_target() ? 1 : 0;
  ranks.sum(plans);
  const double* all = plans.data_ptr<double>();
  int chosen = 0;
  for (int r = 1; r < world; ++r)
    if (all[r * kPlanNumbers] > all[chosen * kPlanNumbers]) chosen = r;
  const double* row = all + chosen * kPlanNumbers;
  if (row[0] == 0) {
    // No rank diagnosed the step (the probe is off, or no rank could re-run it).
    const RecoveryPlan first = plan_values_from(row, plan_texts({})).plan;  // the lowest rank's numbers
    RecoveryPlan agreed;
    agreed.trigger = mine.trigger;
    agreed.counted = first.counted;
    agreed.kernel = first.kernel;
    agreed.action = RecoveryAction::whole_fallback;
    agreed.reason = RecoveryReason::no_rank_diagnosed;
    agreed.remedy = Remedy::whole_fp32;
    return {agreed, recovery_words(agreed, facts, state)};
  }
  // Every rank takes part in the broadcast, the chosen one too.
  PlanValues agreed = plan_values_from(row, text_from_rank(ranks, chosen, texts, int64_t(texts_length_of(row))));
  agreed.plan.trigger = mine.trigger;
  agreed.facts.trigger = facts.trigger;
  agreed.facts.diagnosed_on_rank = chosen;
  if (agreed.plan.action == RecoveryAction::roll_back && int(all[world * kPlanNumbers]) < world) {
    // A rollback is every rank's or none: one rank with no good state to go back to stops the run.
    agreed.plan.action = RecoveryAction::stop;
    agreed.plan.reason = RecoveryReason::rollback_not_everywhere;
  }
  const RecoveryWords words = recovery_words(agreed.plan, agreed.facts, state);
  // The diagnosis is remembered with this rank's birth only (RecoveryActions::apply).
  agreed.plan.diagnosis = chosen == rank ? mine.diagnosis : std::nullopt;
  return {agreed.plan, words};
}

int64_t RecoveryActions::roll_back(int64_t step, const std::string& why) {
  const TrainingState* state = memory_.rollback_target();
  if (!state) throw std::logic_error("StepGuard: a rollback was decided with no good state saved");
  const int64_t to = state->step;
  const std::vector<double> lrs = group_lrs(steered_.optimizer);
  go_back_to(*state, /*with_scaler=*/true);
  memory_.rolled_back(to, step);
  doom_.forget_from(to + 1);
  const std::string text =
      format::rollback_text({to, step, options_.lr_backoff, lrs.empty() ? 0.0 : lrs.front() * memory_.lr_cut(), why});
  journal_.record(step, format::EventKind::rollback, text, "rollback ");
  journal_.flush();
  return to;
}

// The fallback fires again on the model as it had (fp32 weights, scaler off).
void RecoveryActions::restore(const GuardState& s) {
  memory_.restore(s, steered_.model, steered_.optimizer, scaler_, device());
}

}  // namespace nanscope
