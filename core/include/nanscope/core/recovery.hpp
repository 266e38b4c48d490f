#pragma once
// What a failed step gets, decided in one place. The guard measures (the
// step's verdict, the health of the training state, the forensic re-run's
// diagnosis) and keeps its recovery state (fallback used, rollbacks left,
// non-finite steps in a row); decide_recovery turns those into one action of
// a closed set, and StepGuard::apply_recovery alone carries it out. Nothing
// here touches a model, so every rule has its unit test (tests/core/
// recovery_decision_test.cpp) and docs/recovery.md its table.
//
// Two moments call it: a non-finite step (Trigger::nonfinite_step), and the
// end of a step at which the rollback policy says trouble has lasted its
// patience (Trigger::persisting_trouble: spikes, or skip after skip).
#include <cstdint>
#include <functional>
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
// fp32_modules the modules named go to fp32 for the rest of the run
// whole_fallback  the whole model to fp32, LR x lr_backoff (one shot)
// roll_back    back to the newest good saved state before the trouble, LR x lr_backoff
// stop         nothing can save the run: DeadRunError
#define NANSCOPE_RECOVERY_ACTIONS(X) \
  X(skip, "skip")                    \
  X(skip_data, "data")               \
  X(skip_transient, "transient")     \
  X(skip_compiler, "compiler")       \
  X(skip_undiagnosed, "undiagnosed") \
  X(fp32_modules, "fp32-modules") X(whole_fallback, "whole") X(roll_back, "rollback") X(stop, "stop")
NANSCOPE_DECLARE_WORDS_IN(format::Words, RecoveryAction, NANSCOPE_RECOVERY_ACTIONS)

#define NANSCOPE_RECOVERY_TRIGGERS(X) X(nonfinite_step, "non-finite step") X(persisting_trouble, "persisting trouble")
NANSCOPE_DECLARE_WORDS_IN(format::Words, RecoveryTrigger, NANSCOPE_RECOVERY_TRIGGERS)

// What was measured at the failed step.
struct StepFacts {
  RecoveryTrigger trigger = RecoveryTrigger::nonfinite_step;
  std::string what;  // "non-finite loss on rank(s) 1", or the trouble's description
  Amp amp = Amp::bf16;
  bool loss_finite = false;
  bool state_finite = true;  // weights, buffers and optimizer state after the skip
  std::string broken_state;  // when not: "the training state is non-finite (...)"
  // The step's buffers were non-finite and its re-run from the buffers the
  // skip put back was finite: calls outside its losses wrote them.
  bool buffers_written_outside = false;
  // The step's micro-batches can run again (a watched step needs a loss function).
  bool rerunnable = true;
  // --fallback auto: the remedy an earlier step with the same first birth got.
  std::optional<RemedyChoice> same_birth_as;
  int64_t same_birth_step = -1;
  // This step's own words for where its birth is ("micro-batch 1, batch row
  // 24"), from its capture; "" when the capture did not say.
  std::string birth_where;
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
};

struct RecoveryPlan {
  RecoveryAction action = RecoveryAction::skip;
  // What went wrong, as the action's line names it: the fallback's "X at
  // bf16 -> skipped; fallback ...", the rollback's cause, a skip's "X -> skipped".
  std::string subject;
  // The rest of the line: a skip's reason ("loss scale 512"), a remedy's
  // event text, the stop's whole text; "" where the action says it all.
  std::string why;
  Remedy remedy = Remedy::none;           // --fallback auto: the remedy event's word (none: no remedy event)
  std::vector<std::string> modules;       // fp32_modules: the ones to add
  std::optional<RemedyChoice> diagnosis;  // the diagnosis made for this step, if one was
  // The step joins the run of non-finite steps that max_nonfinite_run
  // bounds (not when its fault was written outside it).
  bool counted = true;
  // After this step's skip, a run of non-finite steps has outlasted
  // everything there was to try: the run stops, with this text.
  std::optional<std::string> then_stop;
  // Several ranks: this rank had nothing to diagnose (RemedyChoice::no_say);
  // the plan of a rank that did is every rank's (plan_strength).
  bool no_say = false;
};

// Several ranks act as one process would: each rank decides from what it
// measured, and every rank carries out the strongest plan of them all (the
// lowest rank's among equals). A plan with no say is the weakest; then the
// skips (the stock one, transient, compiler, undiagnosed, data), the fp32
// modules, the whole fallback, a rollback, the stop.
int plan_strength(const RecoveryPlan& plan);

// The fallback fires at this non-finite step: it is on, unused, and this is
// not fp16 overflow at a finite loss the scaler still handles (P5/P10).
bool fallback_due(const StepFacts& facts, const RecoveryState& state);

// The decision. `diagnose` runs the re-runs of --fallback auto's diagnosis
// (remedy.hpp's choose_remedy); it is called only when the decision needs it.
RecoveryPlan decide_recovery(const StepFacts& facts, const RecoveryState& state,
                             const std::function<RemedyChoice()>& diagnose);

}  // namespace nanscope
