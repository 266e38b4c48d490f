#pragma once
// RecoveryActions: carries out what decide_recovery decided for a failed step, and
// alone owns what that changes (RecoveryMemory: the precision, the modules in
// fp32, the LR cut, the saved states, the applied-step counters) and the stop
// of the run. The step runner reports each step to it and reads the rest
// through memory(). Private to the guard's files.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "failed/failed_step_values.hpp"
#include "guard/running_step.hpp"
#include "guard/steered.hpp"
#include "nanscope/core/doom_memory.hpp"
#include "nanscope/core/forensics_memory.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/recovery.hpp"
#include "nanscope/core/recovery_memory.hpp"
#include "nanscope/core/recovery_words.hpp"
#include "nanscope/core/state_health.hpp"

namespace nanscope {

// Every rank's training state finite: one rank's `local` verdict, all-reduced
// under a sharded model (its state is every rank's shards).
bool finite_on_every_rank(const StateHealth& local, GradientAverager* ranks);

class RecoveryActions {
 public:
  RecoveryActions(const GuardOptions& options, Steered& steered, LossScaler& scaler,
                  const std::vector<at::Tensor>& parameters, Journal& journal, ForensicsMemory& forensics,
                  DoomMemory& doom);

  const RecoveryMemory& memory() const { return memory_; }
  // What decide_recovery needs of the guard at `step`.
  RecoveryState state_at(int64_t step) const;

  // --- The step runner's reports (RecoveryMemory's).
  bool observe(int64_t step, double loss, bool nonfinite, bool skipped_as_spike) {
    return memory_.observe(step, loss, nonfinite, skipped_as_spike);
  }
  void finite_step() { memory_.finite_step(); }
  void applied(int64_t step) { memory_.applied(step); }
  void warned(int64_t step) { memory_.warned(step); }
  // Several ranks of a sharded model save alike: each its own shards, on the same steps.
  void save_state_if_due(int64_t step, GradientAverager* ranks);

  // --- A failed step's recovery. `doom`: its search; `held`: the live state
  // while the search's replay stands in for it (let go where the replay
  // stands, else put back); `birth`: its first birth's key (ForensicsMemory).
  RecoveryDone apply(const RunningStep& run, const RecoveryPlan& plan, const RecoveryWords& words,
                     DoomSearchResult* doom = nullptr, HeldLiveState* held = nullptr, const std::string& birth = "");
  // Several ranks: the plan every rank carries out, and its words, made here
  // from the values of the rank whose plan it is (two collectives, on every rank).
  std::pair<RecoveryPlan, RecoveryWords> agree(GradientAverager& ranks, const RecoveryPlan& mine,
                                               const StepFacts& facts, const RecoveryState& state);
  // The doom search's replays undone: the live state it saved comes back
  // (the loss scaler as it is now).
  void undo_replays(const TrainingState& live) { go_back_to(live, /*with_scaler=*/false); }

  // --- The stop: said, flushed, kept ("step S: why"); stop_dead_run throws DeadRunError.
  void stop(int64_t step, const std::string& text);
  [[noreturn]] void stop_dead_run(int64_t step, const std::string& text);
  const std::string& stopped() const { return stopped_; }

  // --- Checkpoints.
  void write_to(GuardState& s) const { memory_.write_to(s); }
  void restore(const GuardState& s);

 private:
  // The one way back to a saved state (a rollback; the doom search's return
  // to the live state): weights, buffers, optimizer and RNG as saved, the
  // loop's LRs kept, the scaler too unless `with_scaler`, gradients cleared.
  void go_back_to(const TrainingState& state, bool with_scaler);
  void fall_back(const RunningStep& run, const std::string& what);  // at the step `run`
  int64_t roll_back(int64_t step, const std::string& why);          // the step the run went back to
  int64_t replay_without(int64_t step, DoomSearchResult& doom, const std::string& what);
  at::Device device() const { return parameters_.front().device(); }

  const GuardOptions& options_;
  Steered& steered_;
  LossScaler& scaler_;
  const std::vector<at::Tensor>& parameters_;
  Journal& journal_;
  ForensicsMemory& forensics_;  // a diagnosed remedy is remembered with its birth
  DoomMemory& doom_;            // a rollback or replay forgets the steps it undid
  RecoveryMemory memory_;
  std::string stopped_;  // "step S: why" once the run was stopped
};

}  // namespace nanscope
