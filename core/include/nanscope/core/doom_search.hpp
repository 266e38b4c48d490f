#pragma once
// The step that doomed the run. A NaN is often not born on the step that
// shows it: a batch of finite but extreme samples (or an LR spike) gives a
// finite update that is applied and wrecks the weights, and the loss goes
// non-finite one, ten or a hundred steps later on a harmless batch.
//
// Definition (docs/recovery.md, "The step that doomed the run"): step d
// doomed the failing step k when, replayed from a saved state before d with
// every update as it was except d's, each step after d and step k itself
// are finite with their losses inside the run's band (below the rollback
// policy's spike threshold). A failure that persists with every update since
// the saved state left out is not an earlier step's doing: nothing is blamed.
// Failures that need several steps' updates are named as the smallest range
// of steps found, never as one of them.
//
// The search is a bisection over ranges of updates left out, then over the
// dooming step's batch rows (without which it survives); this file is the
// decision alone, on any EarlierSteps (the live guard's replays, or a test's
// script), so it is tested without a model.
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// Which updates a replay leaves out: those of the steps first..last; with
// `rows`, only those batch rows of step `first` (== last), the rest of its
// batch still applied.
struct LeaveOut {
  int64_t first = 0, last = -1;
  std::vector<int64_t> rows;
};

class EarlierSteps {
 public:
  virtual ~EarlierSteps() = default;
  // The steps whose updates reached the weights since the saved state, oldest first.
  virtual std::vector<int64_t> applied_steps() const = 0;
  // Replays from the saved state through the failing step with `leave_out`'s
  // updates left out: true when every step replayed and the failing step are
  // finite and inside the loss band.
  virtual bool survives(const LeaveOut& leave_out) = 0;
  // How many batch rows of `step` a replay may leave out one by one: 0 when
  // removing a row would shift the step's random draws (dropout) or the batch
  // has one row.
  virtual int64_t searchable_rows(int64_t step) const = 0;
  // Whether one more replay fits the search's budget (an offline search is
  // bounded by the steps it may run); the live one has none.
  virtual bool budget_left() const { return true; }
};

// What the search found, as a closed vocabulary (its words are the JSON's):
//   dooming_step     `step` (and `rows`, when some rows alone did it)
//   several_steps    no single step: the smallest range found, first..last
//   no_earlier_step  fails with every update since the saved state left out
//   budget_spent     stopped by the budget: the range still suspected, first..last
#define NANSCOPE_DOOM_OUTCOMES(X) \
  X(dooming_step, "dooming_step") \
  X(several_steps, "several_steps") X(no_earlier_step, "no_earlier_step") X(budget_spent, "budget_spent")
NANSCOPE_DECLARE_WORDS_IN(format::Words, DoomOutcome, NANSCOPE_DOOM_OUTCOMES)

struct DoomFinding {
  DoomOutcome outcome = DoomOutcome::no_earlier_step;
  int64_t step = -1;
  std::vector<int64_t> rows;  // empty: the step's whole update (its LR, or no row alone)
  int64_t first = -1, last = -1;
  int replays = 0;
};

DoomFinding find_dooming_step(EarlierSteps& steps);

// "step 40, batch rows 3, 5", "steps 12-19", "no earlier step": the finding as logs and events say it.
std::string doom_text(const DoomFinding& finding);
// The finding as a sentence about failing step `failing`: "step 15 doomed
// step 16: without its update the steps up to 16 stay finite", "no earlier
// step doomed step 16: ...". `rows_text`: the dooming step's rows as said
// (dooming_rows_text in step_replay.hpp).
std::string doom_sentence(const DoomFinding& finding, int64_t failing, const std::string& rows_text);
// The finding as one JSON object (outcome, failing_step, step, rows, first,
// last, replays, steps_run, text): what nanscope.DoomReport is read from.
std::string doom_json(const DoomFinding& finding, int64_t failing, int64_t steps_run, const std::string& sentence);

}  // namespace nanscope
