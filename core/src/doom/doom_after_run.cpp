#include "nanscope/core/doom_after_run.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_replay.hpp"

namespace nanscope {

namespace {

using Rows = std::map<int64_t, size_t>;  // step -> its row in the run file (the last one written)

Rows rows_of(const format::RunData& run) {
  Rows rows;
  for (size_t i = 0; i < run.rows(); ++i) rows[run.step[i]] = i;
  return rows;
}

bool failed(const format::RunData& run, size_t row) {
  return run.skipped[row] && (!std::isfinite(run.loss[row]) || !std::isfinite(run.grad_norm[row]));
}

// The loss band the live search uses: the rollback policy's spike threshold
// after the steps before the failing one.
double loss_band(const RollbackOptions& options, const format::RunData& run, const Rows& rows, int64_t failing) {
  RollbackPolicy policy(options);
  for (const auto& [step, row] : rows)
    if (step < failing) policy.observe(step, run.loss[row], !std::isfinite(run.loss[row]), false);
  return policy.spike_threshold();
}

StepRecord recorded(const format::RunData& run, size_t row, size_t groups) {
  StepRecord r;
  r.step = run.step[row];
  r.lrs.assign(groups, run.lr[row]);
  r.amp = Amp(run.amp[row]);
  r.loss_scale = run.loss_scale[row];
  r.applied = !run.skipped[row];
  return r;
}

std::string replay_line(const LeaveOut& l, int number, int64_t steps_run, double seconds) {
  std::string out = "replay " + std::to_string(number) + ", without step" + (l.first == l.last ? " " : "s ") +
                    std::to_string(l.first);
  if (l.first != l.last) out += "-" + std::to_string(l.last);
  if (!l.rows.empty()) out += " (" + std::to_string(l.rows.size()) + " of its rows)";
  return out + "; " + std::to_string(steps_run) + " steps run, " + seconds_text(seconds);
}

}  // namespace

int64_t failing_step_of(const format::RunData& run, int64_t asked) {
  const Rows rows = rows_of(run);
  if (asked >= 0) {
    if (!rows.count(asked))
      throw std::invalid_argument("step " + std::to_string(asked) + ": " + run.path + " has no row for that step");
    return asked;
  }
  for (const auto& [step, row] : rows)
    if (failed(run, row)) return step;
  throw std::invalid_argument(run.path + " has no non-finite step to explain (name the step to explain)");
}

AfterRunSearch search_after_run(TrainableModel& model, torch::optim::Optimizer& optimizer, double clip,
                                const RollbackOptions& rollback, const AfterRunSteps& steps) {
  const auto start = std::chrono::steady_clock::now();
  const Rows rows = rows_of(steps.run);
  const size_t groups = optimizer.param_groups().size();
  std::map<int64_t, StepRecord> records;  // by step, the failing one last
  for (int64_t step = steps.first_step; step <= steps.failing_step; ++step) {
    const auto row = rows.find(step);
    if (row == rows.end())
      throw std::invalid_argument(steps.run.path + " has no row for step " + std::to_string(step) +
                                  " (between the saved state and the failing step)");
    StepRecord r = recorded(steps.run, row->second, groups);
    steps.rebuild(r);
    records.emplace(step, std::move(r));
  }
  // A batch that brings its own NaN or Inf is its step's cause: there is no earlier one to look for.
  for (const MicroBatch& micro : records.at(steps.failing_step).micro_batches)
    if (const int64_t row = micro.batch.first_nonfinite_row(); row >= 0)
      throw std::invalid_argument("step " + std::to_string(steps.failing_step) + "'s batch holds a non-finite value " +
                                  "(row " + std::to_string(row) + "): its own batch is the cause, no earlier step");
  std::vector<const StepRecord*> between;
  for (const auto& [step, r] : records)
    if (step < steps.failing_step) between.push_back(&r);

  const std::vector<at::Tensor> parameters = trainable_tensors(model);
  StateRing saved(1, std::numeric_limits<size_t>::max());
  saved.save(steps.first_step - 1, model, optimizer, LossScaler{});
  LiveEarlierSteps replays(model, optimizer, parameters, clip, *saved.oldest(), between, records.at(steps.failing_step),
                           loss_band(rollback, steps.run, rows, steps.failing_step));
  replays.set_budget(steps.budget);
  AfterRunSearch out;
  if (!replays.budget_left()) {  // not even the run as it was fits
    out.reproduced = true;
    out.finding.outcome = DoomOutcome::budget_spent;
    out.finding.first = steps.first_step;
    out.finding.last = steps.failing_step - 1;
    return out;
  }
  // The run's own random draws: each step's RNG state, as the run reached it.
  out.reproduced = replays.reproduce(
      [&](const StepRecord& r) { records.at(r.step).micro_batches.front().cpu_rng_state = CpuRngState::now(); });
  out.steps_run = replays.steps_run();
  if (!out.reproduced) {
    out.error = replays.last_error();
    return out;
  }
  int number = 0;
  replays.on_replay([&](const LeaveOut& l) {
    if (!steps.progress) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    steps.progress(replay_line(l, ++number, replays.steps_run(), s));
  });
  out.finding = find_dooming_step(replays);
  out.steps_run = replays.steps_run();
  if (out.finding.outcome == DoomOutcome::dooming_step)
    out.rows_text = dooming_rows_text(&records.at(out.finding.step), out.finding.rows);
  return out;
}

}  // namespace nanscope
