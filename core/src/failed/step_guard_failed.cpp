// A failed step's pipeline, one way through: the step's own lines, the
// forensics' findings (birth, snapshot), the doom search's finding, the facts
// they make, the diagnosis where the decision needs it, the decision
// (decide_recovery: values in, an action out), the ranks' agreement, the
// recovery that carries it out; what they came to is returned as one value
// (FailedStepConclusion), from which the step's end builds its GuardedStep.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "failed/poisoned_samples.hpp"
#include "guard/step_guard_impl.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/generator_states.hpp"
#include "nanscope/core/snapshot_policy.hpp"
#include "nanscope/format/event_text.hpp"

namespace nanscope {
namespace {

bool batches_finite(const probe::Probe& probe, const std::vector<MicroBatch>& micro_batches) {
  for (const MicroBatch& micro : micro_batches)
    if (probe.batch_nonfinite(micro.batch).item<float>() != 0.0f) return false;
  return true;
}

// The fingerprints of the samples this step's birth names: the input's own
// row, the rows its op made non-finite, or (an op whose output has no rows)
// every row of the batch.
std::vector<uint64_t> samples_of(const format::Birth& birth, const Batch& batch) {
  const int64_t n = batch.rows();
  std::vector<int64_t> rows;
  if (birth.op.phase == format::Phase::input) {
    if (birth.sample >= 0) rows.push_back(birth.sample);
    // An input birth's row is the batch's first non-finite one (Batch::first_nonfinite_row).
  } else if (!birth.rows.empty()) {
    rows = birth.rows;
  } else {
    for (int64_t r = 0; r < n; ++r) rows.push_back(r);
  }
  std::vector<uint64_t> out;
  for (int64_t r : rows) out.push_back(batch.row_fingerprint(r));
  return out;
}

}  // namespace

FailedStepConclusion StepGuard::Impl::on_nonfinite_step(RunningStep& run, const std::vector<float>& layer_grad_norm,
                                                        const std::string& undone) {
  // The re-runs below run the step as it ran: with the kernels pinned in their modules.
  std::optional<probe::KernelRegions> kernels;
  if (!kernel_regions().empty()) kernels.emplace(kernel_regions());
  // The re-runs below set the random generators to replay the step's draws;
  // the loop goes on from where its own step left them (a rollback excepted).
  KeepGeneratorStates loop_generators;
  if (!settle_failed_step(run)) {
    say_scalers_backoff(run, undone);
    return {};
  }
  // From here every stage reads the failed step and returns what it made.
  const RunningStep& failed = run;
  FailedStepConclusion out;
  const std::string what = failure_text(failed);
  record_skip(failed, what, undone);
  out.found = forensics_.investigate(failed, layer_grad_norm, std::exchange(model_exception_, nullptr));
  const ForensicFindings& found = out.found;
  // The first failing step of a run of them: was it doomed by an earlier
  // update? Several ranks all enter the search (it is collective) and agree
  // there whether it runs.
  const RecoveryState state = recovery_.state_at(failed.step);
  HeldLiveState held;  // the live state, while a replay without the dooming update stands in for it
  if ((!found.buffers_written_outside || failed.context.averager) && options_.doom_search.enabled &&
      recovery_.memory().nonfinite_in_a_row() == 0)
    out.doom = search_dooming_step(failed, found, replay_possible(state), held);

  StepFacts facts = step_facts(failed, what, found, out.doom);
  facts.diagnosis = diagnosis_if_needed(failed, found, facts, state);
  RecoveryPlan plan = decide_recovery(facts, state);
  RecoveryWords words = recovery_words(plan, facts, state);
  // Several ranks carry out one plan: the strongest any rank made.
  if (failed.context.averager) std::tie(plan, words) = recovery_.agree(*failed.context.averager, plan, facts, state);
  if (plan.action == RecoveryAction::roll_back) loop_generators.keep_as_is();  // the saved state's, as its weights
  say_doom_search(failed.step, out.doom, plan.action == RecoveryAction::replay_without);
  const std::string birth = found.capture && found.capture->first_birth ? birth_key(*found.capture) : std::string();
  out.done = recovery_.apply(failed, plan, words, &out.doom, &held, birth);
  out.listed_samples = list_poisoned_samples(options_.run_dir, failed.step,
                                             failed.context.averager ? failed.context.averager->rank() : -1, plan,
                                             facts.diagnosis, words, found.first_birth);
  return out;
}

// The failed step's last facts, settled before any stage reads it: which
// model call each micro-batch's loss used, whether a micro-batch itself holds
// a NaN/Inf (asked only now: a clean step has no use for it; read as kept at
// their backward), and under loss scaling the scale its re-runs run at.
// False: the loss scaler's routine backoff, no failure to work on.
bool StepGuard::Impl::settle_failed_step(RunningStep& run) {
  decide_micro_batches(run);
  if (options_.probe) run.outcome.batch_finite = batches_finite(probe_, run.micro_batches);
  if (!scalers_backoff(run.outcome, run.loss_scale)) return true;
  if (!nonfinite_without_the_scale(run)) return false;
  // Not the scale's doing: the scale stays as it was, and the step is a
  // failed step like any other, investigated at a scale of 1.
  scaler_.restore(run.loss_scale, run.growth_tracker_before);
  run.rerun_scale = 1.0;
  return true;
}

// fp16's routine, as torch.amp.GradScaler has it: gradients that overflow
// at a finite loss and a finite forward, at a scale above 1, are what the
// scale made of them (the step is skipped and the scale halved), no fault:
// no forensics, no snapshot, no remedy. At a scale of 1 or less the scaler
// no longer explains an overflow, and the step is investigated as any other.
// Several ranks decide alike: every flag here is all ranks'.
bool StepGuard::Impl::scalers_backoff(const StepOutcome& outcome, double loss_scale) const {
  return scaler_.enabled() && outcome.loss_finite && outcome.buffers_finite && !outcome.grads_finite &&
         loss_scale > 1.0;
}

// Whether an overflowing step stays non-finite re-run at a loss scale of 1
// (same weights, batch, RNG state, precision): then the scale made none of
// its NaN/Inf (a 0/0 in the backward, an infinite derivative, a gradient
// beyond fp16's range at any scale). GradScaler cannot tell; one re-run, on
// an overflowing step only, can. A step that cannot be re-run (no loss
// function), a closure optimizer's, or one of several ranks (their re-runs
// would have to agree) keeps GradScaler's reading, as does a re-run that raised.
bool StepGuard::Impl::nonfinite_without_the_scale(const RunningStep& run) {
  if (!steered_.rerunnable(run.watched) || run.context.averager || run.evaluations.failed > 0) return false;
  bool nonfinite = false;
  try {
    nonfinite = !rerun_as_the_step_ran(run, run.micro_batches, 1.0).finite();
  } catch (const std::exception&) {
    nonfinite = false;
  }
  clear_grads(parameters_);
  return nonfinite;
}

namespace {

std::string ranks_text(const RunningStep& run) {
  return run.context.averager ? " on rank(s) " + format::rank_list_text(run.outcome.nonfinite_ranks) : "";
}

}  // namespace

std::string StepGuard::Impl::failure_text(const RunningStep& run) const {
  const StepOutcome& outcome = run.outcome;
  // An optimizer that evaluates the loss itself (L-BFGS) met it at a trial point.
  return std::string(!outcome.loss_finite     ? "non-finite loss"
                     : outcome.buffers_finite ? "non-finite gradients"
                                              : "non-finite buffers") +
         (run.evaluations.failed > 0
              ? " at the optimizer's evaluation " + std::to_string(run.evaluations.failed) + " of the step"
              : std::string()) +
         ranks_text(run);
}

void StepGuard::Impl::say_scalers_backoff(const RunningStep& run, const std::string& undone) {
  const int64_t step = run.step;
  const double scale = run.loss_scale;
  const std::string where = ranks_text(run);
  const std::string backoff = "loss scale " + number_text(scale) + " -> " + number_text(scaler_.scale());
  journal_.event(step, format::EventKind::skip,
                 "gradients overflowed at loss scale " + number_text(scale) + where +
                     "; optimizer step skipped (the loss scaler's backoff)" + undone);
  journal_.event(step, format::EventKind::scale_backoff, backoff);
  journal_.say(step, "gradients overflowed" + where + " -> skipped; " + backoff + " (the scaler's routine)",
               /*routine=*/true);
}

void StepGuard::Impl::record_skip(const RunningStep& run, const std::string& what, const std::string& undone) {
  const int64_t step = run.step;
  journal_.event(step, format::EventKind::skip,
                 what + " at " + step_precision_name(run.amp, steered_.model.own_16bit_type_name()) +
                     "; optimizer step skipped" +
                     (run.evaluations.failed > 0 ? " (weights and optimizer state as before the step)" : "") +
                     (run.error.empty() ? "" : " (the model raised: " + run.error + ")") + undone);
  if (run.context.averager) {
    // Every rank records who went non-finite; the first time, as the run's first.
    const std::string ranks = format::rank_list_text(run.outcome.nonfinite_ranks);
    if (forensics_memory_.nonfinite_ranks(run.outcome.nonfinite_ranks))
      journal_.event(step, format::EventKind::first_nonfinite, ranks);
    journal_.event(step, format::EventKind::nonfinite_ranks, ranks);
  }
  if (scaler_.enabled() && scaler_.scale() != run.loss_scale)
    journal_.event(step, format::EventKind::scale_backoff,
                   "loss scale " + number_text(run.loss_scale) + " -> " + number_text(scaler_.scale()));
}

StepFacts StepGuard::Impl::step_facts(const RunningStep& run, const std::string& what, const ForensicFindings& found,
                                      const DoomSearchResult& doom) const {
  StepFacts facts;
  facts.trigger = RecoveryTrigger::nonfinite_step;
  facts.what = what;
  facts.amp = run.amp;
  facts.own_16bit = steered_.model.own_16bit_type_name();
  facts.loss_finite = run.outcome.loss_finite;
  facts.buffers_written_outside = found.buffers_written_outside;
  facts.rerunnable = steered_.rerunnable(run.watched);
  facts.replay_without_survives = doom.replay_survives;
  // The live state's health (a replay that survived is the decision's
  // already, on every rank alike).
  if (!facts.buffers_written_outside && !doom.replay_survives) {
    const StateHealth health = this->health();
    if (!finite_on_every_rank(health, run.context.averager)) {
      const int64_t last = recovery_.memory().last_applied_step();
      facts.state_finite = false;
      facts.broken_state = "the training state is non-finite (" +
                           (health.finite() ? "on another rank's shard" : health.text()) +
                           "; the last update that reached the weights: " +
                           (last >= 0 ? "step " + std::to_string(last) : std::string("none")) + ")";
    }
  }
  const std::optional<format::Capture>& capture = found.capture;
  if (capture && capture->first_birth) {
    facts.birth_where = format::birth_place_text(*capture->first_birth);
    const Batch& batch = run.micro_batches.at(forensics_.diagnosed_micro_batch(run, capture)).batch;
    const format::Birth& birth = *capture->first_birth;
    if (const ForensicsMemory::Diagnosed* seen =
            forensics_memory_.diagnosed(birth_key(*capture), [&] { return samples_of(birth, batch); })) {
      facts.same_birth_step = seen->step;
      facts.same_birth_as = seen->remedy;
    }
  }
  return facts;
}

std::optional<RemedyChoice> StepGuard::Impl::diagnosis_if_needed(const RunningStep& run, const ForensicFindings& found,
                                                                 const StepFacts& facts, const RecoveryState& state) {
  const bool needed = needs_diagnosis(facts, state);
  // A sharded model's diagnosis runs on every rank together, needed here or not.
  if (run.context.averager && run.context.averager->sharded()) {
    const RemedyChoice choice = forensics_.diagnose_in_lockstep(run, found.capture, needed);
    return needed ? std::optional<RemedyChoice>(choice) : std::nullopt;
  }
  if (!needed) return std::nullopt;
  // Several ranks: a rank that re-ran nothing (its own batch was finite) has no say.
  if (run.context.averager && !found.capture) {
    RemedyChoice none;
    none.no_say = true;
    return none;
  }
  return forensics_.diagnose(run, found.capture);
}

}  // namespace nanscope
