#pragma once
// What the search for a dooming step (doom_search.hpp) needs of each step
// since the oldest saved state to run it again: its micro-batches (references
// to the loop's tensors, not copies) with their RNG states, the LR of each
// parameter group for its update (the guard's cuts included), its precision,
// loss scale and the harness's setup of it (step_setup.hpp), and whether its
// update reached the weights.
// Kept only while the search is on (GuardOptions::doom_search), bounded in
// bytes: the oldest records go first.
#include <cstdint>
#include <deque>
#include <vector>

#include "nanscope/core/precision.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/probe/batch.hpp"

namespace nanscope {

struct StepRecord {
  int64_t step = -1;
  std::vector<MicroBatch> micro_batches;
  std::vector<double> lrs;  // per parameter group, as the update ran
  Amp amp = Amp::fp32;
  double loss_scale = 1;
  StepSetup setup;  // the harness's for this step, again for each replay of it
  bool applied = false;
  at::Tensor batch_rows;  // the batch's rows in the data set (undefined: unknown)
  size_t bytes() const;   // the batches' and RNG states' bytes
};

class StepHistory {
 public:
  explicit StepHistory(size_t max_bytes) : max_bytes_(max_bytes) {}
  void add(StepRecord record);
  // Drops the records of steps at or before `step` (older than the oldest saved state).
  void forget_through(int64_t step);
  // Drops the records of steps at or after `step` (a rolled-back future).
  void forget_from(int64_t step);
  // The records of steps after `after` and before `before`, oldest first;
  // empty when the history no longer reaches back to `after` + 1.
  std::vector<const StepRecord*> between(int64_t after, int64_t before) const;
  size_t bytes() const { return bytes_; }

 private:
  size_t max_bytes_, bytes_ = 0;
  int64_t dropped_through_ = -1;  // the newest step dropped for the byte budget
  std::deque<StepRecord> records_;
};

}  // namespace nanscope
