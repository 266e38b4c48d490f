#pragma once
// What a guarded step is given besides its batch (StepContext), and what it
// gives back (GuardedStep): the verdict, and what the guard did about it.
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/step_outcome.hpp"

namespace nanscope {

class GradientAverager;

// The defaults suit one process.
struct StepContext {
  int64_t step = -1;                     // the step's number; < 0: one after the last step run
  at::Tensor batch_rows;                 // data set rows of the batch (snapshots, replay); empty: unknown
  double lr = -1;                        // the LR the step runs with, for run.h5; < 0: the optimizer's
  GradientAverager* averager = nullptr;  // data parallel: every rank's gradients averaged
  bool stop_requested = false;           // Ctrl-C here, shared so every rank stops after the same step
  static StepContext numbered(int64_t step) {
    StepContext context;
    context.step = step;
    return context;
  }
};

struct GuardedStep {
  StepOutcome outcome;
  at::Tensor loss;  // the step's loss (a host scalar; NaN for a step whose loss was not finite)
  bool counted() const { return !outcome.skipped; }  // the update reached the weights
  Amp amp = Amp::fp32;                               // the precision the step ran in
  double lr = 0;
  double loss_scale = 1;              // the scale it ran with
  double seconds = 0;                 // wall time of the step
  std::string first_birth;            // format::capture_text of the forensic re-run; "" when not investigated
  std::string snapshot;               // the snapshot written, or ""
  bool fell_back = false;             // the whole-model fallback fired at this step
  Remedy remedy = Remedy::none;       // --fallback auto: what the diagnosis chose for this step
  std::vector<std::string> restored;  // buffers the skip put back (the forward had written them)
  std::string error;                  // the model raised during the step (the step was skipped)
  std::vector<std::string> warnings;  // early warnings that fired at this step
  int64_t rolled_back_to = -1;        // the run went back to the state after this step (-1: no rollback)
  // GuardOptions::doom_search, at a failing step: the earlier update that
  // doomed it ("step 40, batch row 3", "steps 12-19", "no earlier step"), or
  // why it was not searched; "" when the search is off or did not run.
  std::string doomed_by;
  int64_t doomed_by_step = -1;     // the dooming step (-1: none named)
  std::vector<int64_t> doom_rows;  // its batch rows without which the run survives (empty: its whole update)
  // A `data` verdict on samples whose data set rows the loop gave: the rows
  // this step added to the run's poison list (RUN_DIR/poisoned_samples.jsonl,
  // format/poison_list.hpp), which later epochs leave out.
  std::vector<int64_t> listed_samples;
};

}  // namespace nanscope
