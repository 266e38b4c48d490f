#pragma once
// What a failed step gets, decided in one place. The guard measures (the
// step's verdict, the health of the training state, the doom search's replay,
// the forensic re-runs' diagnosis) and keeps its recovery state (fallback
// used, rollbacks left, non-finite steps in a row); decide_recovery turns
// those values into one action of a closed set, with no model and no words,
// and StepGuard's RecoveryActions alone carries it out. recovery_words.hpp says it.
// Every rule has its unit test (tests/core/recovery_decision_test.cpp) and
// docs/recovery.md its table.
//
// Two moments call it: a non-finite step (Trigger::nonfinite_step), and the
// end of a step at which the rollback policy says trouble has lasted its
// patience (Trigger::persisting_trouble: spikes, or skip after skip).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/remedy.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// skip         the step's update is dropped, nothing more (the stock loop)
// skip_data    ... because the batch is at fault (--fallback auto's data remedy)
// skip_transient  ... because the same step re-runs finite
// skip_compiler   ... because only the compiled model fails
// skip_undiagnosed ... because no diagnosis could name a cause
// skip_model_or_data ... because the step is non-finite at full precision too
//              (an unsafe op, its trigger rows named where the search found them)
// fp32_modules the modules named go to fp32 for the rest of the run
// pin_kernel   the born op's kernel that kept the step finite is the one its
//              family uses for the rest of the run (in the born op's module)
// whole_fallback  the whole model to fp32, LR x lr_backoff (one shot)
// replay_without  the doom search's replay of the run without the update
//              that doomed this step stands (it counts as a rollback, no LR cut)
// roll_back    back to the newest good saved state before the trouble, LR x lr_backoff
// stop         nothing can save the run: DeadRunError
#define NANSCOPE_RECOVERY_ACTIONS(X)     \
  X(skip, "skip")                        \
  X(skip_data, "data")                   \
  X(skip_transient, "transient")         \
  X(skip_compiler, "compiler")           \
  X(skip_undiagnosed, "undiagnosed")     \
  X(skip_model_or_data, "model_or_data") \
  X(fp32_modules, "fp32-modules")        \
  X(pin_kernel, "kernel")                \
  X(whole_fallback, "whole") X(replay_without, "replay-without") X(roll_back, "rollback") X(stop, "stop")
NANSCOPE_DECLARE_WORDS_IN(format::Words, RecoveryAction, NANSCOPE_RECOVERY_ACTIONS)

#define NANSCOPE_RECOVERY_TRIGGERS(X) X(nonfinite_step, "non-finite step") X(persisting_trouble, "persisting trouble")
NANSCOPE_DECLARE_WORDS_IN(format::Words, RecoveryTrigger, NANSCOPE_RECOVERY_TRIGGERS)

// What was measured at the failed step.
struct StepFacts {
  RecoveryTrigger trigger = RecoveryTrigger::nonfinite_step;
  std::string what;  // "non-finite loss on rank(s) 1", or the trouble's description
  Amp amp = Amp::bf16;
  // The model's own 16-bit weight type ("bfloat16"), "" for wider weights:
  // such a model computes in it with autocast off, and no fallback widens it.
  std::string own_16bit;
  bool loss_finite = false;
  bool state_finite = true;  // weights, buffers and optimizer state after the skip
  std::string broken_state;  // when not: "the training state is non-finite (...)"
  // The step's buffers were non-finite and its re-run from the buffers the
  // skip put back was finite: calls outside its losses wrote them.
  bool buffers_written_outside = false;
  // The step's micro-batches can run again (a watched step needs a loss function).
  bool rerunnable = true;
  // The doom search named the update that doomed this step, and the run
  // replayed without it survives (asked only where replay_possible).
  bool replay_without_survives = false;
  // --fallback auto: the remedy an earlier step with the same fault got (the
  // same first birth, and the same trigger sample where it named one).
  std::optional<RemedyChoice> same_birth_as;
  int64_t same_birth_step = -1;
  // This step's own words for where its birth is ("micro-batch 1, batch row
  // 24"), from its capture; "" when the capture did not say.
  std::string birth_where;
  // --fallback auto's diagnosis of this step: made before the decision
  // wherever needs_diagnosis says the decision needs it (it re-runs the step).
  std::optional<RemedyChoice> diagnosis;
  // Several ranks: the rank whose plan and facts these are (a remedy's words
  // name it); -1 for one process.
  int diagnosed_on_rank = -1;
};

// The guard's recovery state as the step found it.
struct RecoveryState {
  FallbackMode mode = FallbackMode::whole;
  bool fallback_fired = false;
  bool scaler_enabled = false;
  double loss_scale = 1;
  double fallback_min_scale = 1;
  bool rollback_enabled = false;
  bool rollback_left = false;     // rollbacks not all used
  bool good_state_saved = false;  // a saved state from before the trouble began
  int64_t rollbacks = 0;
  int64_t nonfinite_in_a_row = 0;  // before this step
  int64_t nonfinite_since = -1;    // the first of them
  int64_t max_nonfinite_run = 20;  // 0: no limit
  int64_t step = 0;
  format::Origin origin = format::Origin::cpp;  // who set the options: how the words spell them
};

// Why decide_recovery chose its action: what recovery_words says of it.
enum class RecoveryReason {
  stock_skip,              // skip: the fallback is not due (off, used, or fp16's scaler handles it)
  written_outside,         // skip, not counted: calls outside the step wrote its buffers
  broken_state,            // roll_back or stop: the weights, buffers or optimizer state are non-finite
  stock_fallback,          // whole_fallback: --fallback whole
  remedies_did_not_hold,   // whole_fallback: non-finite step after step under --fallback auto
  same_birth_again,        // skip_data or whole_fallback: the first birth an earlier step was diagnosed with
  no_loss_fn,              // whole_fallback: nothing to diagnose the step with
  diagnosed,               // the remedy the diagnosis chose
  no_say,                  // skip: several ranks, this one had nothing to diagnose
  no_rank_diagnosed,       // whole_fallback: several ranks, none diagnosed the step
  replayed,                // replay_without
  trouble_quiet,           // skip: persisting trouble the stock loop lives with
  trouble_rollback,        // roll_back: persisting trouble
  trouble_fallback,        // whole_fallback: persisting trouble, no good state to go back to
  trouble_unstable,        // stop: persisting trouble through rollbacks and fp32
  rollback_not_everywhere  // stop: several ranks, not every one holds a good state
};

struct RecoveryPlan {
  RecoveryTrigger trigger = RecoveryTrigger::nonfinite_step;  // the facts'
  RecoveryAction action = RecoveryAction::skip;
  RecoveryReason reason = RecoveryReason::stock_skip;
  Remedy remedy = Remedy::none;                     // --fallback auto: the remedy event's word (none: no remedy event)
  std::vector<std::string> modules;                 // fp32_modules: the ones to add; kernel: the born op's module
  format::Kernel kernel = format::Kernel::unknown;  // pin_kernel: the one pinned
  std::optional<RemedyChoice> diagnosis;            // the diagnosis made for this step, if one was
  // The step is trouble: it joins the run of non-finite steps that
  // max_nonfinite_run bounds and the rollback policy's count of trouble.
  // Not when its fault is explained without the model: written outside it,
  // or the same fault as an earlier step's (same birth, same trigger sample),
  // which got its remedy then.
  bool counted = true;
  // After this step's skip, a run of non-finite steps has outlasted
  // everything there was to try: the run stops.
  bool then_stop = false;
  // Several ranks: this rank had nothing to diagnose (RemedyChoice::no_say);
  // the plan of a rank that did is every rank's (plan_strength).
  bool no_say = false;
};

// Several ranks act as one process would: each rank decides from what it
// measured, and every rank carries out the strongest plan of them all (the
// lowest rank's among equals). A plan with no say is the weakest; then the
// skips (the stock one, transient, compiler, undiagnosed, data), the fp32
// modules, the whole fallback, the replay without the dooming update, a
// rollback, the stop.
int plan_strength(const RecoveryPlan& plan);

// The fallback fires at this non-finite step: it is on, unused, and this is
// not fp16 overflow at a finite loss the scaler still handles.
bool fallback_due(const StepFacts& facts, const RecoveryState& state);

// The run may go back to a saved state: rollback on, rollbacks left. The doom
// search tries its replay only then (StepFacts::replay_without_survives).
bool replay_possible(const RecoveryState& state);

// The decision needs --fallback auto's diagnosis of the step (StepFacts::diagnosis).
bool needs_diagnosis(const StepFacts& facts, const RecoveryState& state);

// The decision: facts and state in, one action out. Throws std::logic_error
// where the decision needs a diagnosis the facts lack.
RecoveryPlan decide_recovery(const StepFacts& facts, const RecoveryState& state);

}  // namespace nanscope
