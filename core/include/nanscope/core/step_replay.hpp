#pragma once
// The replays a dooming-step search runs on the live model (doom_search.hpp):
// from a saved state (the rollback ring's) through the failing step, each
// recorded step recomputed (forward, backward, unscale, the guard's clip) and
// its update applied by the optimizer with the LR it ran with, some updates
// left out. The model's buffers are not advanced by replayed steps (a
// re-run is no training step: BatchNorm's statistics stay the saved state's).
// The caller saves and puts back the live state around the search.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_history.hpp"

namespace nanscope {

class LiveEarlierSteps : public EarlierSteps {
 public:
  // `steps`: the records after `from`'s step, before `failing`'s, oldest
  // first. `loss_band`: a loss above it (a spike) does not survive.
  LiveEarlierSteps(TrainableModel& model, torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                   double clip, const TrainingState& from, std::vector<const StepRecord*> steps,
                   const StepRecord& failing, double loss_band);

  std::vector<int64_t> applied_steps() const override;
  bool survives(const LeaveOut& leave_out) override;
  int64_t searchable_rows(int64_t step) const override;
  // A replay is started only if the steps it may run keep the total within `budget_steps`.
  bool budget_left() const override;
  void set_budget(int64_t budget_steps) { budget_ = budget_steps; }
  // Several ranks replay together, each its own micro-batches: each replayed
  // step's gradients are the whole step's (averaged across the ranks, or
  // reduced by a sharded backward) and its verdict is every rank's. A step's
  // rows are those of the whole batch, every rank's in rank order (as one
  // process with the summed batch reads them): a row left out is left out by
  // the rank that holds it.
  void set_ranks(GradientAverager* ranks) { ranks_ = ranks; }
  // The dooming step's `rows` as said: "batch row 3 (data set row 120)"; with
  // several ranks "rank 1's batch row 3", and its data set rows on rank 1
  // itself where `data_set_rows`.
  std::string rows_text(const StepRecord* record, const std::vector<int64_t>& rows, bool data_set_rows = true) const;
  // Called before each replay with what it leaves out: a progress line.
  void on_replay(std::function<void(const LeaveOut&)> callback) { on_replay_ = std::move(callback); }
  // Runs every step as the run did, nothing left out, calling `before` ahead
  // of each (the failing step last): a run read back from its files gives
  // each step there the RNG state it began with. True when the failing step
  // fails again, as the search needs.
  bool reproduce(const std::function<void(const StepRecord&)>& before);
  // The steps replayed in all so far (each replay counts the steps it ran).
  int64_t steps_run() const { return steps_run_; }
  // What the last step that raised said ("": none raised); such a step does not survive.
  const std::string& last_error() const { return last_error_; }

 private:
  // Recomputes one step (some rows left out) and applies its update: false
  // when it was non-finite or its loss above `loss_band`.
  bool run(const StepRecord& record, const std::vector<int64_t>& rows_left_out, bool update, double loss_band);
  // Several ranks: every rank's verdict on a replayed step (`ok` is this
  // rank's), and the norm of the whole step's gradients, for the clip.
  bool across_ranks(bool ok, double& norm);

  TrainableModel& model_;
  torch::optim::Optimizer& optimizer_;
  const std::vector<at::Tensor>& parameters_;
  double clip_;
  const TrainingState& from_;
  std::vector<const StepRecord*> steps_;
  const StepRecord& failing_;
  double loss_band_;
  // The rows of this step, this rank's own, or 0 where a row cannot be left out.
  int64_t own_searchable_rows(const StepRecord& record) const;
  // Several ranks: the rows `rows_left_out` (of the whole batch) that are this rank's, as its own.
  std::vector<int64_t> own_rows(const std::vector<int64_t>& rows_left_out) const;

  GradientAverager* ranks_ = nullptr;
  // Several ranks: where each rank's rows begin in the whole batch of the
  // step searchable_rows was last asked about (its last entry: the total).
  mutable std::vector<int64_t> rank_offsets_;
  int64_t steps_run_ = 0;
  std::string last_error_;
  int64_t budget_ = std::numeric_limits<int64_t>::max();
  std::function<void(const LeaveOut&)> on_replay_;
};

// "batch row 3 (data set row 120)" for `rows` of `record` (nullptr: data set
// rows unknown); "its update" without rows (the step's whole update did it).
std::string dooming_rows_text(const StepRecord* record, const std::vector<int64_t>& rows);

// A record's micro-batches without some of its rows, counted across its
// micro-batches in order; a micro-batch left with no row is dropped.
std::vector<MicroBatch> without_rows(const std::vector<MicroBatch>& micro_batches, const std::vector<int64_t>& rows);

}  // namespace nanscope
