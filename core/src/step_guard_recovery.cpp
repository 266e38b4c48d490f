// StepGuard's recovery: the rollback to a saved good state, the whole-model
// fp32 fallback, the states saved for them, and the stop of a run nothing can
// save.
#include "nanscope/core/step_guard.hpp"

#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep_reruns.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/event_text.hpp"
#include "step_guard_impl.hpp"

namespace nanscope {

void StepGuard::Impl::fall_back(int64_t step, GuardedStep& result, const std::string& what) {
  recovery_.fall_back(steered_.model, steered_.optimizer, scaler_, parameters_.front().device(), step);
  result.fell_back = true;
  // A run already in fp32 has no wider precision to go to: its fallback is the LR cut alone.
  const std::string lr_cut = "LR x " + number_text(options_.lr_backoff);
  journal_.record(
      step, format::EventKind::fallback,
      result.amp == Amp::fp32 ? "fp32: " + lr_cut + " (already fp32: no wider precision to fall back to)"
                              : std::string(precision_name(result.amp)) + " -> fp32, " + lr_cut,
      what + " at " + precision_name(result.amp) + (result.counted() ? " -> fallback " : " -> skipped; fallback "));
  amp_ = Amp::fp32;
}

void StepGuard::Impl::stop_dead_run(int64_t step, const std::string& text) {
  journal_.record(step, format::EventKind::stop, text);
  journal_.flush();
  stopped_ = "step " + std::to_string(step) + ": " + text;
  throw DeadRunError(stopped_);
}

void StepGuard::Impl::stop_for_failed_rank(int rank, const std::string& error) {
  const int64_t step = watched_ ? watched_->run.step : next_step_ - 1;
  if (watched_ && watched_->run.setup) watched_->run.setup(false);
  watched_.reset();
  const std::string text = "failed on rank " + std::to_string(rank) + ": " + error +
                           "; a step of several ranks cannot go on without every rank: the run stops on each (the "
                           "others end with the process group's error, at once or at its timeout)";
  journal_.record(step, format::EventKind::stop, text);
  journal_.flush();
  stopped_ = "step " + std::to_string(step) + ": " + text;
}

void StepGuard::Impl::refuse_if_stopped() const {
  // A loop that misses the stop would otherwise pay a forensic re-run on
  // every later step of a run nothing can save.
  if (!stopped_.empty())
    throw DeadRunError("the guard stopped the run at " + stopped_ +
                       " (no further step: end the loop, or start again from a healthy checkpoint)");
}

void StepGuard::Impl::save_state_if_due(int64_t step, GradientAverager* ranks) {
  if (!recovery_.rollback().wants_state(step)) return;
  // A sharded model's state is kept by every rank or by none (each rank's
  // budget meets its own shards).
  const bool sharded = ranks && ranks->sharded();
  // A sick state is never kept: a rollback to it would restore the sickness.
  const StateHealth health = this->health();
  if (!state_finite_on_every_rank(health, ranks)) {
    journal_.record(step, format::EventKind::save_refused,
                    "rollback state after step " + std::to_string(step) + " not kept: " +
                        (health.finite() ? std::string("another rank's shards") : health.text()) + " non-finite");
    return;
  }
  bool saved = recovery_.save(step, steered_.model, steered_.optimizer, scaler_);
  if (sharded && !ranks->every_rank(saved)) {
    recovery_.forget_saved_from(step);
    saved = false;
  }
  const StateRing& ring = recovery_.saved_states();
  if (!saved && ring.size() == 0 && ring.max_states() > 0) {
    // One state is over the memory budget: say so once, and stop trying.
    journal_.say(step, "rollback: one saved state is larger than the " + number_text(options_.rollback.memory_mb) +
                           " MB budget (--rollback-memory" + (sharded ? ", on some rank" : "") +
                           "); no rollback possible");
    recovery_.stop_saving();
  }
}

void StepGuard::Impl::go_back_to(const TrainingState& state, bool with_scaler) {
  // The groups' LR is the loop's (a saved optimizer state carries the LR of
  // its step): it stays as the loop set it; the guard's cut is its own (lr_cut).
  const GroupLrScope loop_lrs(steered_.optimizer);
  LossScaler unchanged = scaler_;
  const bool scaling = scaler_.enabled();
  StateRing::restore(state, steered_.model, steered_.optimizer, with_scaler ? scaler_ : unchanged);
  if (!scaling) scaler_.disable();  // the fp32 fallback stays
  clear_grads(parameters_);
}

bool StepGuard::Impl::state_finite_on_every_rank(const StateHealth& local, GradientAverager* ranks) const {
  // A sharded model's state is every rank's shards: sick if any rank's is, so
  // that every rank acts alike (one all-reduce, on every rank).
  return ranks && ranks->sharded() ? ranks->every_rank(local.finite()) : local.finite();
}

RecoveryState StepGuard::Impl::recovery_state(int64_t step) const {
  RecoveryState s;
  const RollbackPolicy& rollback = recovery_.rollback();
  s.mode = recovery_.fallback().mode();
  s.fallback_fired = recovery_.fallback().fired();
  s.scaler_enabled = scaler_.enabled();
  s.loss_scale = scaler_.scale();
  s.fallback_min_scale = options_.fallback_min_scale;
  s.rollback_enabled = options_.rollback.enabled;
  s.rollback_left = rollback.can_roll_back();
  s.good_state_saved = recovery_.rollback_target() != nullptr;
  s.rollbacks = rollback.rollbacks();
  s.nonfinite_in_a_row = recovery_.nonfinite_in_a_row();
  s.nonfinite_since = recovery_.nonfinite_since();
  s.max_nonfinite_run = options_.max_nonfinite_run;
  s.step = step;
  return s;
}

// The one place a recovery is carried out: only here do the precision, the
// LR cut and the saved states change for a failed step.
void StepGuard::Impl::apply_recovery(int64_t step, GuardedStep& result, RecoveryTrigger trigger, const RecoveryPlan& r,
                                     const std::string& birth) {
  const std::string remedy_text = std::string(remedy_name(r.remedy)) + ": " + r.why;
  // A remedy that is the step's whole outcome: its event and its line in one.
  auto remedy_record = [&] {
    result.remedy = r.remedy;
    journal_.record(step, format::EventKind::remedy, remedy_text, r.subject + " -> skipped; ");
  };
  switch (r.action) {
    case RecoveryAction::skip:
      if (!r.subject.empty()) journal_.say(step, r.subject + " -> skipped" + r.why);
      break;
    case RecoveryAction::skip_data:
    case RecoveryAction::skip_transient:
    case RecoveryAction::skip_compiler:
    case RecoveryAction::skip_undiagnosed: remedy_record(); break;
    case RecoveryAction::fp32_modules:
      fp32_modules_.insert(fp32_modules_.end(), r.modules.begin(), r.modules.end());
      remedy_record();
      break;
    case RecoveryAction::whole_fallback:
      // The whole-model fallback's remedy event has no line: fall_back's says it.
      if (r.remedy != Remedy::none) {
        result.remedy = r.remedy;
        journal_.event(step, format::EventKind::remedy, remedy_text);
      }
      fall_back(step, result, r.subject);
      break;
    case RecoveryAction::roll_back: roll_back(step, result, r.subject); break;
    case RecoveryAction::stop: stop_dead_run(step, r.why);
    case RecoveryAction::unknown: break;
  }
  // --fallback auto: the same first birth later needs no new diagnosis.
  if (r.diagnosis && (r.diagnosis->remedy == Remedy::skip_data || r.diagnosis->remedy == Remedy::fp32_modules))
    forensics_.remember(birth, step, *r.diagnosis);
  if (trigger == RecoveryTrigger::persisting_trouble && r.action != RecoveryAction::roll_back) recovery_.escalated();
  journal_.flush();  // a skip is exactly what a post-mortem wants on disk
  if (trigger == RecoveryTrigger::nonfinite_step && r.action != RecoveryAction::roll_back && r.counted)
    recovery_.count_nonfinite(step);
  if (r.then_stop) stop_dead_run(step, *r.then_stop);
}

namespace {

// A plan's words and modules as one text, to pass from rank to rank.
constexpr char kPlanField = '\x1f', kPlanItem = '\x1e';

std::string plan_text(const RecoveryPlan& plan) {
  return joined({plan.subject, plan.why, joined(plan.modules, kPlanItem), plan.then_stop ? "1" + *plan.then_stop : ""},
                kPlanField);
}

}  // namespace

// Several ranks decide as one process does: the rank(s) whose batch failed
// diagnosed it, the others have no say, and every rank carries out the
// strongest plan (plan_strength), worded as the rank that made it worded it.
// Two sums on a failed step (the plans, then the chosen one's words); nothing
// on a clean one.
RecoveryPlan StepGuard::Impl::agree_on_recovery(GradientAverager& ranks, const RecoveryPlan& mine) {
  const int world = ranks.world_size(), rank = ranks.rank();
  const std::string text = plan_text(mine);
  // Per rank: strength, action, remedy, counted, text length; then how many
  // ranks have a state to roll back to.
  constexpr int kPlanFields = 5;
  at::Tensor plans = at::zeros({world * kPlanFields + 1}, at::kDouble);
  auto* p = plans.data_ptr<double>() + rank * kPlanFields;
  p[0] = plan_strength(mine);
  p[1] = double(mine.action);
  p[2] = double(mine.remedy);
  p[3] = mine.counted ? 1 : 0;
  p[4] = double(text.size());
  plans.data_ptr<double>()[world * kPlanFields] = recovery_.rollback_target() ? 1 : 0;
  ranks.sum(plans);
  const double* all = plans.data_ptr<double>();
  int chosen = 0;
  for (int r = 1; r < world; ++r)
    if (all[r * kPlanFields] > all[chosen * kPlanFields]) chosen = r;
  const double* c = all + chosen * kPlanFields;

  RecoveryPlan agreed;
  agreed.action = RecoveryAction(int(c[1]));
  agreed.remedy = Remedy(int(c[2]));
  agreed.counted = c[3] != 0;
  if (c[0] == 0) {
    // No rank diagnosed the step (the probe is off, or no rank could re-run it).
    agreed.action = RecoveryAction::whole_fallback;
    agreed.remedy = Remedy::whole_fp32;
    agreed.subject = mine.subject;
    agreed.why = "no rank diagnosed the step";
    return agreed;
  }
  // Every rank takes part in the sum, the chosen one too.
  const std::vector<std::string> fields = split_on(text_from_rank(ranks, chosen, text, int64_t(c[4])), kPlanField);
  if (chosen == rank) agreed.diagnosis = mine.diagnosis;  // remembered with this rank's birth only
  agreed.subject = fields.at(0);
  // A remedy's words name the rank whose diagnosis it is (a stock skip's are a loss scale).
  agreed.why = agreed.remedy == Remedy::none ? fields.at(1) : "rank " + std::to_string(chosen) + ": " + fields.at(1);
  if (!fields.at(2).empty()) agreed.modules = split_on(fields.at(2), kPlanItem);
  if (!fields.at(3).empty()) agreed.then_stop = fields.at(3).substr(1);
  if (agreed.action == RecoveryAction::roll_back && int(all[world * kPlanFields]) < world) {
    // A rollback is every rank's or none: one rank with no good state to go back to stops the run.
    agreed.action = RecoveryAction::stop;
    agreed.why = agreed.subject +
                 "; a rollback was due, but not every rank holds a good state to go back to: the "
                 "run stops";
  }
  return agreed;
}

void StepGuard::Impl::roll_back(int64_t step, GuardedStep& result, const std::string& why) {
  const TrainingState* state = recovery_.rollback_target();
  if (!state) throw std::logic_error("StepGuard: a rollback was decided with no good state saved");
  const int64_t to = state->step;
  const std::vector<double> lrs = group_lrs(steered_.optimizer);
  go_back_to(*state, /*with_scaler=*/true);
  recovery_.rolled_back(to, step);
  doom_.forget_from(to + 1);
  last_applied_step_ = to;
  result.rolled_back_to = to;
  const std::string text =
      format::rollback_text({to, step, options_.lr_backoff, lrs.empty() ? 0.0 : lrs.front() * lr_multiplier(), why});
  journal_.record(step, format::EventKind::rollback, text, "rollback ");
  journal_.flush();
}

}  // namespace nanscope
