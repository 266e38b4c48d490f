#pragma once
// The search for the step that doomed a run (doom_search.hpp), after the run:
// from a state loaded before the failing step (a checkpoint), over the steps
// the run file recorded (applied or skipped, the LR of each update, its
// precision and loss scale), each step's batch rebuilt by the caller
// (nanscope-train from the step number, Python from the user's function).
// The run's random draws are replayed from the generator's state at the
// loaded checkpoint: a first replay of the run as it was gives each step the
// RNG state it began with, and checks that the failing step fails again.
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/step_history.hpp"
#include "nanscope/format/run_file.hpp"

namespace nanscope {

// The step to explain: `asked` (>= 0, which must have a row) or the run's
// first non-finite step (skipped with a non-finite loss or gradient norm).
// Throws std::invalid_argument saying what is missing.
int64_t failing_step_of(const format::RunData& run, int64_t asked);

struct AfterRunSearch {
  bool reproduced = false;  // the failing step failed again (else nothing was searched)
  DoomFinding finding;
  std::string rows_text;  // the dooming step's rows with their data set rows; "its update" without rows
  int64_t steps_run = 0;  // every replay's steps, the run as it was included
  std::string error;      // not reproduced because a step raised: what it said
};

struct AfterRunSteps {
  AfterRunSteps(const format::RunData& run_data, int64_t first, int64_t failing)
      : run(run_data), first_step(first), failing_step(failing) {}
  const format::RunData& run;
  int64_t first_step;  // the loaded state is the one after first_step - 1
  int64_t failing_step;
  // Fills a record's micro-batches, data set rows and planted fault for its step.
  std::function<void(StepRecord&)> rebuild;
  int64_t budget = 5000;                             // steps replayed in all
  std::function<void(const std::string&)> progress;  // a line per replay (may be empty)
};

// Searches from the model's and optimizer's current state, which the search
// leaves as its last replay made it (reload the checkpoint to go on).
AfterRunSearch search_after_run(TrainableModel& model, torch::optim::Optimizer& optimizer, double clip,
                                const RollbackOptions& rollback, const AfterRunSteps& steps);

}  // namespace nanscope
