// StepGuard's search for the earlier step whose update doomed a failing one
// (doom_search.hpp, docs/recovery.md), and the recovery that replays the run
// without it.
#include <chrono>

#include "guard/step_guard_impl.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/generator_states.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/core/step_replay.hpp"
#include "nanscope/probe/birth_category.hpp"

namespace nanscope {

namespace {

// A step's micro-batches as a replay runs them: a loop that accumulated N
// micro-batches divided each loss by N (the usual accumulation), which is
// what a replay does; the recorded loss only weights a re-run of the same
// weights (the forensic one).
std::vector<MicroBatch> replayable(const std::vector<MicroBatch>& micro_batches) {
  std::vector<MicroBatch> out = micro_batches;
  for (MicroBatch& m : out) {
    if (std::isfinite(m.recorded_loss)) m.loss_weight = 1.0 / double(out.size());
    m.recorded_loss = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

// Whether every rank can search (`mine`) and keeps as many steps as this one
// (`steps`): two sums, on a failing step only.
bool every_rank_can_search(GradientAverager& ranks, bool mine, size_t steps) {
  at::Tensor counts = at::full({1}, double(steps), at::kDouble);
  ranks.sum(counts);
  const bool same_steps = counts.item<double>() == double(steps) * ranks.world_size();
  return ranks.every_rank(mine && same_steps);
}

}  // namespace

void StepGuard::Impl::record_for_doom_search(const RunningStep& run) {
  // A loop's own update rule cannot be replayed, nor an optimizer's closure
  // evaluations (they need the step's loss, which the search does not keep).
  if (!steered_.applies_update || steered_.update_evaluates_closure) return;
  StepRecord record;
  record.step = run.step;
  record.micro_batches = replayable(run.micro_batches);
  for (double lr : group_lrs(steered_.optimizer)) record.lrs.push_back(lr * lr_multiplier());
  record.amp = run.amp;
  record.loss_scale = run.loss_scale;
  record.setup = run.setup;
  record.applied = !run.outcome.skipped;
  record.batch_rows = run.context.batch_rows;
  const TrainingState* oldest = recovery_.memory().saved_states().oldest();
  doom_.record(std::move(record), oldest ? oldest->step : -1);
}

// Why the search cannot run at this step ("" : it can). Not this step's
// updates, or its own batch: no earlier step to look for.
std::string StepGuard::Impl::doom_search_refused(const RunningStep& run, const ForensicFindings& found,
                                                 const TrainingState* from) const {
  GradientAverager* const ranks = run.context.averager;
  const std::optional<format::Capture>& capture = found.capture;
  if (found.buffers_written_outside) return "its buffers were written outside its steps";
  if (!run.outcome.batch_finite) return "the batch holds a non-finite value";
  if (capture && capture->first_birth &&
      (capture->first_birth->op.phase == format::Phase::input ||
       probe::category_of(*capture->first_birth) == format::Category::all_targets_ignored))
    return "the birth is the batch's own";
  if (!steered_.applies_update) return "the loop applies its own update, which a replay cannot repeat";
  if (steered_.update_evaluates_closure)
    return "the optimizer evaluates the loss itself (L-BFGS), which a replay of its steps cannot repeat";
  if (ranks && !ranks->sums())
    return "several ranks whose process group cannot sum (every rank's verdict on a replay needs it)";
  if (!steered_.rerunnable(run.watched)) return "no loss function to replay steps with";
  if (!steered_.runs_other_batches(run.watched))
    return "the closure runs its own batch only (give a loss function of the batch)";
  if (!from) return "no state saved yet to replay from";
  return "";
}

DoomSearchResult StepGuard::Impl::search_dooming_step(const RunningStep& run, const ForensicFindings& found,
                                                      bool may_replay_without, HeldLiveState& held) {
  const int64_t step = run.step;
  DoomSearchResult doom;
  GradientAverager* const ranks = run.context.averager;
  const TrainingState* from = recovery_.memory().saved_states().oldest();
  const std::vector<const StepRecord*> records =
      from ? doom_.steps_between(from->step, step) : std::vector<const StepRecord*>{};
  std::string why = doom_search_refused(run, found, from);
  // The weights the earlier finding blamed are still the run's: no new search.
  const DoomMemory::Finding* const found_before = why.empty() ? doom_.still_explains(from->step) : nullptr;
  if (why.empty() && !found_before && records.empty() && step > from->step + 1)
    why = "the steps since the saved state are no longer kept (doom_search.memory_mb)";
  // Several ranks replay together, each its own batches (a sharded forward is
  // a collective): every rank searches, over the same steps, or none does.
  if (ranks && ranks->sums() && !every_rank_can_search(*ranks, why.empty(), records.size()) && why.empty())
    why = "another rank cannot (its run-rank-R.h5 says why)";
  if (!why.empty()) {
    doom.doomed_by = "not searched: " + why;
    journal_.say(step, "doomed by: " + doom.doomed_by);
    return doom;
  }
  if (found_before) {
    const DoomFinding& f = found_before->finding;
    doom.doomed_by = doom_text(f) + " (found at step " + std::to_string(found_before->at_step) + ")";
    doom.doomed_by_step = f.step;
    doom.rows = f.rows;
    journal_.say(step, "doomed by: " + doom.doomed_by);
    return doom;
  }
  replay_earlier_steps(run, *from, records, may_replay_without, doom, held);
  return doom;
}

// The search proper: replays from the oldest saved state find the dooming
// update; where the run may go back (`may_replay_without`), a replay without
// it is tried to the end. The live state comes back unless that replay
// survived (then `held` keeps it for the recovery's decision); the loop's LRs
// and random generators come back either way.
void StepGuard::Impl::replay_earlier_steps(const RunningStep& run, const TrainingState& from,
                                           const std::vector<const StepRecord*>& records, bool may_replay_without,
                                           DoomSearchResult& doom, HeldLiveState& held) {
  const int64_t step = run.step;
  const auto start = std::chrono::steady_clock::now();
  std::optional<GroupLrScope> loop_lrs(std::in_place, steered_.optimizer);
  StateRing live(1, std::numeric_limits<size_t>::max());
  live.save(step, steered_.model, steered_.optimizer, scaler_);
  const KeepGeneratorStates loop_generators;  // the replays draw; the loop's draws go on from here
  StepRecord failing;
  failing.step = step;
  failing.micro_batches = replayable(run.micro_batches);
  failing.amp = run.amp;
  failing.loss_scale = run.loss_scale;
  failing.setup = run.setup;
  std::optional<ClosureModel::Step> with_loss_fn;
  steered_.run_other_batches_through_loss_fn(with_loss_fn, run.watched, failing.micro_batches.front().batch);
  // The replays run the modules the fallback moved to fp32 in fp32, as the
  // steps did; each step replays at its own precision (at fp32 they switch nothing).
  std::optional<Fp32ModuleRegions> fp32;
  if (!fp32_modules().empty()) fp32.emplace(steered_.model, fp32_modules());
  LiveEarlierSteps replays(steered_.model, steered_.optimizer, parameters_, options_.clip, from, records, failing,
                           recovery_.memory().rollback().spike_threshold());
  replays.set_ranks(run.context.averager);
  const DoomFinding finding = find_dooming_step(replays);
  doom.replay_survives = finding.outcome == DoomOutcome::dooming_step && may_replay_without &&
                         replays.survives({finding.step, finding.step, finding.rows});
  if (doom.replay_survives)
    held.hold(std::move(live));
  else
    recovery_.undo_replays(*live.oldest());
  loop_lrs.reset();
  clear_grads(parameters_);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  doom.finding = finding;
  doom.replayed_from = from.step;
  doom.doomed_by = doom_text(finding);
  // The event's text fits run.h5's event width: the cost in one clause.
  const std::string cost = std::to_string(finding.replays) + " replays from the state after step " +
                           std::to_string(from.step) + ", " + std::to_string(replays.steps_run()) + " steps run, " +
                           seconds_text(seconds);
  if (finding.outcome != DoomOutcome::dooming_step) {
    doom.sentence = doom_sentence(finding, step, "") + "; " + cost;
    return;
  }
  doom.doomed_by_step = finding.step;
  doom.rows = finding.rows;
  const StepRecord* doomer = nullptr;
  for (const StepRecord* r : records)
    if (r->step == finding.step) doomer = r;
  // Several ranks name the rank whose rows they were, alike on every rank.
  if (run.context.averager && !finding.rows.empty())
    doom.doomed_by = "step " + std::to_string(finding.step) + ", " + replays.rows_text(doomer, finding.rows, false);
  doom.sentence = doom_sentence(finding, step, replays.rows_text(doomer, finding.rows)) + "; " + cost;
}

// The search's sentence, once the recovery is decided: a finding not acted
// on is remembered (a later failing step it still explains needs no search).
void StepGuard::Impl::say_doom_search(int64_t step, const DoomSearchResult& doom, bool replayed) {
  if (!doom.finding) return;
  const DoomFinding& finding = *doom.finding;
  if (finding.outcome != DoomOutcome::dooming_step) {
    journal_.record(step, format::EventKind::doom, doom.sentence, "doomed by: ");
    return;
  }
  if (!replayed) doom_.found(step, finding);
  journal_.record_about(finding.step, step, format::EventKind::doom,
                        doom.sentence + (replayed ? "; recovered: replayed without it" : ""), "doomed by: ");
}

}  // namespace nanscope
