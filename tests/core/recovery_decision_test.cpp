// The recovery decision as a table: each row is what was measured at a failed
// step and the guard's recovery state, and the action it must get. No model
// runs: where the decision says it needs a diagnosis, a stand-in says what
// it would have found. The words come from the plan and the facts.
#include <gtest/gtest.h>

#include <cctype>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "nanscope/core/recovery.hpp"
#include "nanscope/core/recovery_words.hpp"

using namespace nanscope;

namespace recovery_decision_test {

struct Row {
  const char* name;
  std::function<void(StepFacts&, RecoveryState&)> given;
  Remedy diagnosis;  // what the stand-in diagnosis finds (unknown: the decision must not need one)
  RecoveryAction action;
  Remedy remedy;     // the remedy event's word (none: no remedy event)
  bool stops_after;  // then_stop set
  const char* says;  // in the words' why, or their then_stop when stops_after ("" : not checked)
};

// A bf16 step with a non-finite loss, the stock whole fallback unused, rollback off.
void failed_bf16_step(StepFacts& f, RecoveryState& s) {
  f.trigger = RecoveryTrigger::nonfinite_step;
  f.what = "non-finite loss";
  f.amp = Amp::bf16;
  f.loss_finite = false;
  s.mode = FallbackMode::whole;
  s.rollback_enabled = false;
  s.max_nonfinite_run = 20;
  s.step = 7;
}

void automatic(StepFacts&, RecoveryState& s) { s.mode = FallbackMode::automatic; }
void fp16_overflow_at_a_good_scale(StepFacts& f, RecoveryState& s) {
  f.amp = Amp::fp16;
  f.loss_finite = true;
  s.scaler_enabled = true;
  s.loss_scale = 1024;
  s.fallback_min_scale = 1;
}
void rollback_with_a_good_state(StepFacts&, RecoveryState& s) {
  s.rollback_enabled = true;
  s.rollback_left = true;
  s.good_state_saved = true;
}
void long_run_of_skips(StepFacts&, RecoveryState& s) {
  s.nonfinite_in_a_row = 19;  // this step is the 20th
  s.nonfinite_since = 3;
}
void persisting(StepFacts& f, RecoveryState&) {
  f.trigger = RecoveryTrigger::persisting_trouble;
  f.what = "trouble on 2 steps in a row";
  f.loss_finite = true;
}

template <typename... F>
std::function<void(StepFacts&, RecoveryState&)> all(F... steps) {
  return [=](StepFacts& f, RecoveryState& s) { (steps(f, s), ...); };
}

const std::vector<Row>& rows() {
  static const std::vector<Row> table{
      // --- A non-finite step, --fallback whole (the stock loop).
      {"stock: the first non-finite step falls back", all(failed_bf16_step), Remedy::unknown,
       RecoveryAction::whole_fallback, Remedy::none, false, ""},
      {"stock: fp16 overflow at a finite loss is the scaler's", all(failed_bf16_step, fp16_overflow_at_a_good_scale),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ", loss scale 1024"},
      {"stock: fp16 overflow once the scale collapsed falls back",
       all(failed_bf16_step, fp16_overflow_at_a_good_scale, [](StepFacts&, RecoveryState& s) { s.loss_scale = 0.5; }),
       Remedy::unknown, RecoveryAction::whole_fallback, Remedy::none, false, ""},
      {"stock: fp16 with a non-finite loss falls back",
       all(failed_bf16_step, fp16_overflow_at_a_good_scale,
           [](StepFacts& f, RecoveryState&) { f.loss_finite = false; }),
       Remedy::unknown, RecoveryAction::whole_fallback, Remedy::none, false, ""},
      {"stock: one shot only",
       all(failed_bf16_step,
           [](StepFacts& f, RecoveryState& s) {
             s.fallback_fired = true;
             f.amp = Amp::fp32;
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ""},
      {"fallback off: skip", all(failed_bf16_step, [](StepFacts&, RecoveryState& s) { s.mode = FallbackMode::off; }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ""},
      {"at fp32 the fallback is the LR cut",
       all(failed_bf16_step, [](StepFacts& f, RecoveryState&) { f.amp = Amp::fp32; }), Remedy::unknown,
       RecoveryAction::whole_fallback, Remedy::none, false, ""},
      // --- The doom search's replay without the update that doomed the step.
      {"doom: a replay that survives stands",
       all(failed_bf16_step, rollback_with_a_good_state,
           [](StepFacts& f, RecoveryState&) {
             f.replay_without_survives = true;
             f.state_finite = false;  // the live state's sickness is what the replay leaves behind
           }),
       Remedy::unknown, RecoveryAction::replay_without, Remedy::none, false, ""},
      {"doom: no rollback left, the replay does not stand",
       all(failed_bf16_step, automatic, rollback_with_a_good_state,
           [](StepFacts& f, RecoveryState& s) {
             f.replay_without_survives = true;
             s.rollback_left = false;
           }),
       Remedy::skip_data, RecoveryAction::skip_data, Remedy::skip_data, false, "; no fallback"},
      // --- The training state went non-finite: skipping cannot save it.
      {"sick state with a good state saved rolls back",
       all(failed_bf16_step, rollback_with_a_good_state,
           [](StepFacts& f, RecoveryState&) {
             f.state_finite = false;
             f.broken_state = "the training state is non-finite (parameter w)";
           }),
       Remedy::unknown, RecoveryAction::roll_back, Remedy::none, false, ""},
      {"sick state without rollback stops",
       all(failed_bf16_step,
           [](StepFacts& f, RecoveryState&) {
             f.state_finite = false;
             f.broken_state = "the training state is non-finite (parameter w)";
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false, "skipping cannot save them: the run stops"},
      {"sick state, rollbacks used up, stops",
       all(failed_bf16_step, rollback_with_a_good_state,
           [](StepFacts& f, RecoveryState& s) {
             f.state_finite = false;
             s.rollback_left = false;
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false,
       "and every rollback allowed is used (GuardOptions::rollback.max_rollbacks): the run stops"},
      {"sick state before any healthy state was kept, stops",
       all(failed_bf16_step, rollback_with_a_good_state,
           [](StepFacts& f, RecoveryState& s) {
             f.state_finite = false;
             s.good_state_saved = false;
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false,
       "and no healthy state was kept before the trouble to roll back to (one is kept every "
       "GuardOptions::rollback.every healthy steps): the run stops"},
      {"buffers written outside the step: skip, nothing more",
       all(failed_bf16_step, [](StepFacts& f, RecoveryState&) { f.buffers_written_outside = true; }), Remedy::unknown,
       RecoveryAction::skip, Remedy::none, false, "the buffers from before those calls are back"},
      // --- --fallback auto: the diagnosis decides.
      {"auto: data", all(failed_bf16_step, automatic), Remedy::skip_data, RecoveryAction::skip_data, Remedy::skip_data,
       false, "; no fallback"},
      {"auto: transient", all(failed_bf16_step, automatic), Remedy::skip_transient, RecoveryAction::skip_transient,
       Remedy::skip_transient, false, ""},
      {"auto: compiler", all(failed_bf16_step, automatic), Remedy::skip_compiler, RecoveryAction::skip_compiler,
       Remedy::skip_compiler, false, ""},
      {"auto: a diagnosis whose re-runs raised escalates nothing", all(failed_bf16_step, automatic),
       Remedy::skip_undiagnosed, RecoveryAction::skip_undiagnosed, Remedy::skip_undiagnosed, false, "; no fallback"},
      {"auto: modules to fp32", all(failed_bf16_step, automatic), Remedy::fp32_modules, RecoveryAction::fp32_modules,
       Remedy::fp32_modules, false, "now in fp32"},
      {"auto: nothing smaller helps", all(failed_bf16_step, automatic), Remedy::whole_fp32,
       RecoveryAction::whole_fallback, Remedy::whole_fp32, false, ""},
      {"auto: not diagnosable is whole", all(failed_bf16_step, automatic), Remedy::none, RecoveryAction::whole_fallback,
       Remedy::whole_fp32, false, ""},
      {"auto: no loss function to re-run with",
       all(failed_bf16_step, automatic, [](StepFacts& f, RecoveryState&) { f.rerunnable = false; }), Remedy::unknown,
       RecoveryAction::whole_fallback, Remedy::whole_fp32, false, "no loss function"},
      {"auto: a remedy that did not hold", all(failed_bf16_step, automatic, long_run_of_skips), Remedy::unknown,
       RecoveryAction::whole_fallback, Remedy::whole_fp32, false, "20 non-finite steps in a row"},
      {"auto: the same data birth again is skipped again",
       all(failed_bf16_step, automatic,
           [](StepFacts& f, RecoveryState&) {
             f.same_birth_as = RemedyChoice{Remedy::skip_data, {}, "the batch holds a non-finite value"};
             f.same_birth_step = 3;
           }),
       Remedy::unknown, RecoveryAction::skip_data, Remedy::skip_data, false, "again (as step 3)"},
      {"auto: the same unsafe op on the same trigger sample again is skipped again",
       all(failed_bf16_step, automatic,
           [](StepFacts& f, RecoveryState&) {
             f.same_birth_as = RemedyChoice{Remedy::skip_model_or_data, {}, "finite without batch row 5"};
             f.same_birth_as->trigger_samples = {42};
             f.same_birth_step = 3;
           }),
       Remedy::unknown, RecoveryAction::skip_model_or_data, Remedy::skip_model_or_data, false,
       "again (as step 3): the same first birth and trigger sample"},
      {"auto: non-finite at fp32 too", all(failed_bf16_step, automatic), Remedy::skip_model_or_data,
       RecoveryAction::skip_model_or_data, Remedy::skip_model_or_data, false, "; no fallback"},
      {"auto: the same birth after its fp32 modules is whole",
       all(failed_bf16_step, automatic,
           [](StepFacts& f, RecoveryState&) {
             f.same_birth_as = RemedyChoice{Remedy::fp32_modules, {"norm"}, "finite with norm in fp32"};
             f.same_birth_step = 3;
           }),
       Remedy::unknown, RecoveryAction::whole_fallback, Remedy::whole_fp32, false, "with norm in fp32"},
      {"auto: another kernel of the born op finite: it is pinned", all(failed_bf16_step, automatic), Remedy::kernel,
       RecoveryAction::pin_kernel, Remedy::kernel, false, "now pinned process-wide for the rest of the run"},
      {"auto: the same birth after its kernel was pinned is whole",
       all(failed_bf16_step, automatic,
           [](StepFacts& f, RecoveryState&) {
             f.same_birth_as = RemedyChoice{Remedy::kernel, {}, "flash non-finite (the step's), math finite"};
             f.same_birth_as->kernel = format::Kernel::math;
             f.same_birth_step = 3;
           }),
       Remedy::unknown, RecoveryAction::whole_fallback, Remedy::whole_fp32, false, "with math pinned"},
      {"auto: fp16 overflow the scaler handles is not diagnosed",
       all(failed_bf16_step, automatic, fp16_overflow_at_a_good_scale), Remedy::unknown, RecoveryAction::skip,
       Remedy::none, false, ""},
      // --- A dead run: a long run of skips with nothing left to try.
      {"dead: after the fallback, rollback off",
       all(failed_bf16_step, long_run_of_skips,
           [](StepFacts& f, RecoveryState& s) {
             s.fallback_fired = true;
             f.amp = Amp::fp32;
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, true,
       "non-finite on 20 steps in a row; the trouble began at step 3 (after the fp32 fallback, rollback off)"},
      {"dead: after the LR cut of a model of its own bf16 weights, rollback off",
       all(failed_bf16_step, long_run_of_skips,
           [](StepFacts& f, RecoveryState& s) {
             s.fallback_fired = true;
             f.own_16bit = "bfloat16";
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, true,
       "(after the fallback's LR cut, in the model's own bfloat16 weights, rollback off)"},
      {"dead: fallback off, no good state",
       all(failed_bf16_step, long_run_of_skips,
           [](StepFacts&, RecoveryState& s) {
             s.mode = FallbackMode::off;
             s.rollback_enabled = true;
             s.rollback_left = true;
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, true, "(fallback off, no good state to roll back to)"},
      {"not dead while a rollback can still be tried",
       all(failed_bf16_step, long_run_of_skips, rollback_with_a_good_state,
           [](StepFacts&, RecoveryState& s) { s.mode = FallbackMode::off; }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ""},
      {"not dead while the fallback is left (fp16 the scaler handles)",
       all(failed_bf16_step, long_run_of_skips, fp16_overflow_at_a_good_scale), Remedy::unknown, RecoveryAction::skip,
       Remedy::none, false, ""},
      {"not dead at the step the fallback fires", all(failed_bf16_step, long_run_of_skips), Remedy::unknown,
       RecoveryAction::whole_fallback, Remedy::none, false, ""},
      {"a limit of 0 never stops",
       all(failed_bf16_step, long_run_of_skips,
           [](StepFacts&, RecoveryState& s) {
             s.mode = FallbackMode::off;
             s.max_nonfinite_run = 0;
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ""},
      // --- Trouble that outlasted the rollback policy's patience.
      {"trouble: rollback off does nothing more", all(failed_bf16_step, persisting), Remedy::unknown,
       RecoveryAction::skip, Remedy::none, false, ""},
      {"trouble: rolls back", all(failed_bf16_step, persisting, rollback_with_a_good_state), Remedy::unknown,
       RecoveryAction::roll_back, Remedy::none, false, ""},
      {"trouble: no rollback left, falls back",
       all(failed_bf16_step, persisting, rollback_with_a_good_state,
           [](StepFacts&, RecoveryState& s) {
             s.rollback_left = false;
             s.rollbacks = 3;
           }),
       Remedy::unknown, RecoveryAction::whole_fallback, Remedy::none, false, ""},
      {"trouble: no state saved yet, nothing failed but the step",
       all(failed_bf16_step, persisting,
           [](StepFacts&, RecoveryState& s) {
             s.rollback_enabled = true;
             s.rollback_left = true;
             s.fallback_fired = true;
           }),
       Remedy::unknown, RecoveryAction::skip, Remedy::none, false, ""},
      {"trouble: rollbacks and fallback used up stops",
       all(failed_bf16_step, persisting,
           [](StepFacts& f, RecoveryState& s) {
             s.rollback_enabled = true;
             s.rollbacks = 3;
             s.fallback_fired = true;
             f.amp = Amp::fp32;
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false,
       "after 3 rollback(s) and at fp32: the model itself is unstable; the run stops"},
      {"trouble: rollbacks used up with the fallback off stops, at the run's own precision",
       all(failed_bf16_step, persisting,
           [](StepFacts&, RecoveryState& s) {
             s.mode = FallbackMode::off;
             s.rollback_enabled = true;
             s.rollbacks = 3;
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false,
       "after 3 rollback(s) and at bf16 with the fallback off: the model itself is unstable; the run stops"},
      {"trouble: a model of its own bf16 weights, rollbacks and its LR cut used up, stops",
       all(failed_bf16_step, persisting,
           [](StepFacts& f, RecoveryState& s) {
             s.rollback_enabled = true;
             s.rollbacks = 3;
             s.fallback_fired = true;
             f.own_16bit = "bfloat16";
           }),
       Remedy::unknown, RecoveryAction::stop, Remedy::none, false,
       "after 3 rollback(s) and in the model's own bfloat16 weights: the model itself is unstable; the run stops"},
  };
  return table;
}

class RecoveryDecision : public testing::TestWithParam<size_t> {};

TEST_P(RecoveryDecision, GivesTheActionItsRowSays) {
  const Row& row = rows().at(GetParam());
  StepFacts facts;
  RecoveryState state;
  row.given(facts, state);
  const bool asked = needs_diagnosis(facts, state);
  if (asked) {
    RemedyChoice choice;
    choice.remedy = row.diagnosis;
    choice.why = "the stand-in diagnosis";
    if (row.diagnosis == Remedy::fp32_modules) choice.modules = {"blocks.0.attn"};
    facts.diagnosis = choice;
  }
  const RecoveryPlan r = decide_recovery(facts, state);
  const RecoveryWords words = recovery_words(r, facts, state);
  SCOPED_TRACE(row.name);
  EXPECT_EQ(to_string(r.action), std::string(to_string(row.action)));
  EXPECT_EQ(to_string(r.remedy), std::string(to_string(row.remedy)));
  EXPECT_EQ(asked, row.diagnosis != Remedy::unknown) << "the diagnosis runs re-runs: asked only where it decides";
  EXPECT_EQ(r.then_stop, row.stops_after) << words.then_stop;
  const std::string said = row.stops_after ? words.then_stop : words.why;
  EXPECT_NE(said.find(row.says), std::string::npos) << said;
  if (r.action == RecoveryAction::fp32_modules) {
    EXPECT_EQ(r.modules, std::vector<std::string>{"blocks.0.attn"});
  }
  if (r.diagnosis) {
    EXPECT_EQ(r.diagnosis->remedy, row.diagnosis) << "the diagnosis is kept for the same birth later";
  }
}

INSTANTIATE_TEST_SUITE_P(Table, RecoveryDecision, testing::Range(size_t(0), rows().size()),
                         [](const testing::TestParamInfo<size_t>& info) {
                           std::string name;
                           for (char c : std::string(rows().at(info.param).name))
                             name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(RecoveryDecision, EveryActionHasARow) {
  for (size_t a = 0; a < format::Words<RecoveryAction>::count; ++a) {
    bool found = false;
    for (const Row& row : rows()) found = found || size_t(row.action) == a;
    EXPECT_TRUE(found) << to_string(RecoveryAction(a));
  }
}

}  // namespace recovery_decision_test

TEST(RecoveryDecision, TheSameBirthAgainIsWordedWithThisStepsRowNotTheFirstOnes) {
  StepFacts facts;
  RecoveryState state;
  recovery_decision_test::failed_bf16_step(facts, state);
  recovery_decision_test::automatic(facts, state);
  facts.same_birth_as = RemedyChoice{Remedy::skip_data, {}, "finite without batch row(s) 21"};
  facts.same_birth_step = 2;
  facts.birth_where = "batch row 24";
  ASSERT_FALSE(needs_diagnosis(facts, state)) << "the earlier diagnosis decides";
  const RecoveryPlan r = decide_recovery(facts, state);
  const std::string why = recovery_words(r, facts, state).why;
  EXPECT_EQ(r.action, RecoveryAction::skip_data);
  EXPECT_NE(why.find("again (as step 2): the same first birth and sample, here in batch row 24"), std::string::npos)
      << why;
  EXPECT_EQ(why.find("21"), std::string::npos) << "step 2's row is not this step's: " << why;
}

// The decision is pure: one that needs the step's diagnosis and is not given
// it says so instead of guessing.
TEST(RecoveryDecision, ADecisionThatNeedsTheDiagnosisRefusesWithoutIt) {
  StepFacts facts;
  RecoveryState state;
  recovery_decision_test::failed_bf16_step(facts, state);
  recovery_decision_test::automatic(facts, state);
  ASSERT_TRUE(needs_diagnosis(facts, state));
  EXPECT_THROW(decide_recovery(facts, state), std::logic_error);
  facts.diagnosis = RemedyChoice{Remedy::skip_transient, {}, "finite on re-run"};
  EXPECT_FALSE(needs_diagnosis(facts, state));
  EXPECT_EQ(decide_recovery(facts, state).action, RecoveryAction::skip_transient);
}

// Several ranks: a rank whose own batch was finite re-ran nothing and has no
// say; its plan is the weakest of all, so the plan of the rank that diagnosed
// the step is every rank's (StepGuard's agreement carries out the strongest).
TEST(RecoveryDecision, ARankWithNothingToDiagnoseHasTheWeakestPlan) {
  StepFacts facts;
  RecoveryState state;
  recovery_decision_test::failed_bf16_step(facts, state);
  recovery_decision_test::automatic(facts, state);
  RemedyChoice none;
  none.no_say = true;
  facts.diagnosis = none;
  const RecoveryPlan no_say = decide_recovery(facts, state);
  EXPECT_TRUE(no_say.no_say);
  EXPECT_EQ(plan_strength(no_say), 0);
  auto plan = [](RecoveryAction action) {
    RecoveryPlan p;
    p.action = action;
    return p;
  };
  // A skip < data < a pinned kernel < fp32 modules < whole < rollback < stop.
  const std::vector<RecoveryAction> weakest_first = {RecoveryAction::skip,
                                                     RecoveryAction::skip_transient,
                                                     RecoveryAction::skip_compiler,
                                                     RecoveryAction::skip_undiagnosed,
                                                     RecoveryAction::skip_model_or_data,
                                                     RecoveryAction::skip_data,
                                                     RecoveryAction::pin_kernel,
                                                     RecoveryAction::fp32_modules,
                                                     RecoveryAction::whole_fallback,
                                                     RecoveryAction::replay_without,
                                                     RecoveryAction::roll_back,
                                                     RecoveryAction::stop};
  ASSERT_EQ(weakest_first.size(), format::Words<RecoveryAction>::count) << "every action has its place";
  for (size_t i = 0; i < weakest_first.size(); ++i) {
    EXPECT_GT(plan_strength(plan(weakest_first[i])), 0) << to_string(weakest_first[i]);
    if (i > 0) {
      EXPECT_GT(plan_strength(plan(weakest_first[i])), plan_strength(plan(weakest_first[i - 1])))
          << to_string(weakest_first[i]);
    }
  }
}

// The same data fault met again (the same birth and sample as an earlier
// step's) gets the remedy it got then and escalates nothing: it is no
// trouble for the rollback policy and no step of a dead run. A fault seen for
// the first time counts, whatever its cause: distinct faults step after step
// are evidence of their own (a carried state gone NaN feeds every batch).
TEST(RecoveryDecision, TheSameDataFaultMetAgainIsNotCountedAsTrouble) {
  StepFacts facts;
  RecoveryState state;
  recovery_decision_test::failed_bf16_step(facts, state);
  recovery_decision_test::automatic(facts, state);
  RemedyChoice first;
  first.remedy = Remedy::skip_data;
  facts.diagnosis = first;
  EXPECT_TRUE(decide_recovery(facts, state).counted);
  facts.diagnosis.reset();
  facts.same_birth_as = RemedyChoice{Remedy::skip_data, {}, "the batch holds a non-finite value"};
  facts.same_birth_step = 3;
  state.nonfinite_in_a_row = 18;
  const RecoveryPlan again = decide_recovery(facts, state);
  EXPECT_EQ(again.action, RecoveryAction::skip_data);
  EXPECT_FALSE(again.counted);
  EXPECT_FALSE(again.then_stop);
  // An ordinary sample tripping the same op again still counts: the model may
  // have changed under it.
  facts.same_birth_as = RemedyChoice{Remedy::skip_model_or_data, {}, "finite without batch row 5"};
  const RecoveryPlan trigger_again = decide_recovery(facts, state);
  EXPECT_EQ(trigger_again.action, RecoveryAction::skip_model_or_data);
  EXPECT_TRUE(trigger_again.counted);
}
