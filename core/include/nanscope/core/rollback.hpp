#pragma once
// When skipping cannot save a run. The stock loop skips a non-finite step and
// keeps the weights; that fails when the weights themselves are broken (they
// went non-finite, or a burst of finite but huge updates wrecked them so that
// every later step spikes or overflows). The policy watches each step's loss
// for that trouble and says when to go back to a saved good state
// (state_ring.hpp); StepGuard does the going back.
//
// Trouble: a step whose loss is non-finite (or, without fp16's scaler, whose
// gradients are), or whose loss is `spike_ratio` times the largest loss of a
// healthy step (once there have been ten: the first few are no baseline). A rollback is due when the weights are
// non-finite, or when trouble lasts `patience` steps in a row (a loss spike that comes back after a skip). After a
// rollback the run is on probation for `probation_steps`: a step whose loss spikes is skipped instead of applied (the
// batches shown to be bad), and `max_probation_skips` of those in a row mean the cause persists.
#include <cstdint>
#include <limits>

namespace nanscope {

struct RollbackOptions {
  bool enabled = true;
  int64_t every = 25;         // save a state after every this many healthy steps
  int64_t states = 4;         // keep this many (the oldest goes first)
  double memory_mb = 1024;    // and no more host memory than this
  int64_t max_rollbacks = 3;  // per run
  int64_t patience = 2;       // trouble on this many steps in a row calls for a rollback
  double spike_ratio = 10.0;  // a loss this many times the largest healthy loss is a spike
  int64_t probation_steps = 50;
  int64_t max_probation_skips = 20;
};

class RollbackPolicy {
 public:
  explicit RollbackPolicy(RollbackOptions options);

  const RollbackOptions& options() const { return options_; }
  // The loss above which the step at `step` is skipped rather than applied:
  // finite only on probation after a rollback.
  double skip_loss_above(int64_t step) const;

  // A step's loss (all ranks' mean) and whether it counts as trouble
  // (non-finite, or a spike); returns true for a step that was trouble.
  bool observe(int64_t step, double loss, bool nonfinite, bool skipped_as_spike);
  // Trouble has lasted long enough to act on (patience, or probation skips).
  bool trouble_persists() const;
  // The first step of the current trouble; a warning shortly before it moves it earlier.
  int64_t trouble_began() const;
  void warned(int64_t step);
  // A state may be saved after this healthy step.
  bool wants_state(int64_t step) const;
  // States are saved even with rollback off: the search for a dooming step
  // replays from them (GuardOptions::doom_search); nothing rolls back.
  void keep_states_for_search() { keep_states_ = true; }
  // The loss that makes a spike: spike_ratio x the largest healthy loss (+inf before any).
  double spike_threshold() const;

  void rolled_back(int64_t step);
  void escalated() { streak_ = 0, probation_skips_ = 0; }
  // The step just observed as trouble turned out to be explained without the
  // model (RecoveryPlan::counted): it leaves the count as it found it.
  void explained() {
    if (streak_ > 0 && --streak_ == 0) streak_start_ = -1;
  }
  bool can_roll_back() const { return options_.enabled && rollbacks_ < options_.max_rollbacks; }
  int64_t rollbacks() const { return rollbacks_; }
  void restore_rollbacks(int64_t n) { rollbacks_ = n; }

 private:
  RollbackOptions options_;
  double max_healthy_loss_ = 0;
  int64_t healthy_steps_ = 0;
  int64_t streak_ = 0, streak_start_ = -1;
  int64_t probation_until_ = -1, probation_skips_ = 0;
  int64_t last_warning_ = std::numeric_limits<int64_t>::min() / 2;
  int64_t rollbacks_ = 0;
  bool keep_states_ = false;
};

}  // namespace nanscope
