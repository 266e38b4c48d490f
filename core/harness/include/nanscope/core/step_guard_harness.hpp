#pragma once
// What the tools built on the guard call beside a loop's own StepGuard calls:
// the Python binding's model hooks and its step numbering, nanscope-train's
// records in the run file and its planted faults. Not installed: a loop of
// yours needs none of it (step_guard.hpp is its whole face).
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/step_guard.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

class StepGuardHarness {
 public:
  explicit StepGuardHarness(StepGuard& guard) : guard_(guard) {}

  // A call of the model ended (Python's forward hook; C++ loops call
  // begin_micro_batch() alone).
  void end_model_call();
  bool step_open() const;  // a watched step began and step() has not ended it
  // Throws the DeadRunError once the guard stopped the run.
  void refuse_if_stopped() const;
  // Several ranks: this rank's step raised, or its collective failed; the run
  // stops here with one line, and the exception is the caller's to let through.
  void stop_for_failed_rank(int rank, const std::string& error);
  int64_t next_step() const;
  void number_steps_from(int64_t step);  // steps without a number go on from here
  // What the loop around the guard records in run.h5 (a refused checkpoint, a rank's error).
  void record_event(int64_t step, format::EventKind kind, const std::string& text);
  // The harness's setup of each step, which every re-run of the step repeats
  // (nanscope-train plants its --fault faults so; step_setup.hpp).
  void set_step_setup(StepSetupHook hook);
  const std::vector<int>& first_nonfinite_ranks() const;  // at the first skip, several ranks
  // The ranks every step of this guard runs with (the Python binding's
  // process group): the watched form's unscale() then begins the flags'
  // reduction, which step() finishes (GradientAverager::begin_average).
  void set_ranks(GradientAverager* ranks);
  // This rank's flags for the open watched step (prepare_rank_flags), for a
  // communication hook to send in the gradients' last reduction; undefined
  // where there is none to send (no watched step with a loss, no ranks, a
  // sharded model, an averager that averages itself). step() waits for their
  // reduction through GradientAverager::average.
  at::Tensor flags_for_gradient_reduction();

 private:
  StepGuard& guard_;
};

}  // namespace nanscope
