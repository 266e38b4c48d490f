// The search for the step that doomed a run, on scripted replays: which
// updates, left out, let the run survive. No model: the decision only.
#include <gtest/gtest.h>

#include <set>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/format/event_text.hpp"

using namespace nanscope;

namespace {

// A run of applied steps 10..10+n-1; it survives a replay exactly when the
// replay leaves out every update in `needed` (or, for `row_steps`, at least
// one of `needed_rows` of that step).
struct ScriptedSteps : EarlierSteps {
  std::vector<int64_t> steps;
  std::set<int64_t> needed;  // steps whose updates must all be left out
  std::set<int64_t> needed_rows;
  int64_t rows = 8;
  bool fails_anyway = false;     // the failing step's own batch: nothing left out saves it
  bool all_rows_needed = false;  // every row of needed_rows must be left out (else any one)
  int replays = 0;
  int budget = 1 << 30;  // replays the search may run

  explicit ScriptedSteps(int64_t n) {
    for (int64_t s = 10; s < 10 + n; ++s) steps.push_back(s);
  }
  std::vector<int64_t> applied_steps() const override { return steps; }
  bool survives(const LeaveOut& l) override {
    ++replays;
    if (fails_anyway) return false;
    for (int64_t s : needed) {
      if (s < l.first || s > l.last) return false;
      if (!l.rows.empty()) {
        if (needed_rows.empty()) return false;  // the whole update did it: no subset of rows saves the run
        size_t hit = 0;
        for (int64_t r : l.rows) hit += needed_rows.count(r);
        if (hit == 0 || (all_rows_needed && hit < needed_rows.size())) return false;
      }
    }
    return true;
  }
  int64_t searchable_rows(int64_t) const override { return rows; }
  bool budget_left() const override { return replays < budget; }
};

}  // namespace

TEST(DoomSearch, NamesTheDoomingStepAndItsRowByBisectionAtEveryDistance) {
  for (int64_t n : {1, 2, 10, 100}) {
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      ScriptedSteps steps(n);
      steps.needed = {10 + at};
      steps.needed_rows = {5};
      const DoomFinding f = find_dooming_step(steps);
      ASSERT_EQ(f.outcome, DoomOutcome::dooming_step) << n << " " << at;
      EXPECT_EQ(f.step, 10 + at);
      EXPECT_EQ(f.rows, std::vector<int64_t>{5});
      EXPECT_EQ(doom_text(f), "step " + std::to_string(10 + at) + ", batch row 5");
      // A bisection, not a scan: about 2 log2(n) replays for the step, 2 log2(8) for the row.
      EXPECT_LE(f.replays, 1 + 2 * 7 + 2 * 3) << n;
      EXPECT_EQ(f.replays, steps.replays);
    }
  }
}

TEST(DoomSearch, AnLrSpikeIsTheStepsWholeUpdateWithNoRowBlamed) {
  ScriptedSteps steps(40);
  steps.needed = {33};  // any half of its rows, at that LR, dooms the run as well
  const DoomFinding f = find_dooming_step(steps);
  ASSERT_EQ(f.outcome, DoomOutcome::dooming_step);
  EXPECT_EQ(f.step, 33);
  EXPECT_TRUE(f.rows.empty());
  EXPECT_EQ(doom_text(f), "step 33");
}

TEST(DoomSearch, AFailureOfTheStepsOwnBatchBlamesNoEarlierStep) {
  ScriptedSteps steps(50);
  steps.fails_anyway = true;
  const DoomFinding f = find_dooming_step(steps);
  EXPECT_EQ(f.outcome, DoomOutcome::no_earlier_step);
  EXPECT_EQ(f.step, -1);
  EXPECT_EQ(f.replays, 1);  // one replay with every update left out says it
  EXPECT_EQ(doom_text(f), "no earlier step");
  ScriptedSteps none(0);
  EXPECT_EQ(find_dooming_step(none).outcome, DoomOutcome::no_earlier_step);
}

TEST(DoomSearch, UpdatesThatDoomOnlyTogetherAreARangeNotOneOfThem) {
  ScriptedSteps steps(32);
  steps.needed = {12, 30};  // the run survives only with both left out
  const DoomFinding f = find_dooming_step(steps);
  ASSERT_EQ(f.outcome, DoomOutcome::several_steps);
  EXPECT_LE(f.first, 12);
  EXPECT_GE(f.last, 30);
  EXPECT_EQ(f.step, -1);
  EXPECT_EQ(doom_text(f), "steps " + std::to_string(f.first) + "-" + std::to_string(f.last));
}

TEST(DoomSearch, TwoRowsThatDoomOnlyTogetherBlameTheStepNotAnInnocentRow) {
  ScriptedSteps steps(4);
  steps.needed = {11};
  steps.rows = 6;
  steps.needed_rows = {1, 4};
  steps.all_rows_needed = true;  // the run survives only without both
  const DoomFinding f = find_dooming_step(steps);
  ASSERT_EQ(f.outcome, DoomOutcome::dooming_step);
  EXPECT_EQ(f.step, 11);
  EXPECT_TRUE(f.rows.empty()) << doom_text(f);
}

TEST(DoomSearch, ABudgetStopsTheSearchAndNamesTheRangeStillSuspected) {
  ScriptedSteps steps(100);
  steps.needed = {73};
  steps.budget = 5;  // the innocence test and two halvings
  const DoomFinding f = find_dooming_step(steps);
  EXPECT_EQ(steps.replays, 5);
  ASSERT_EQ(f.outcome, DoomOutcome::budget_spent);
  EXPECT_LE(f.first, 73);
  EXPECT_GE(f.last, 73);
  EXPECT_LT(f.last - f.first, 99);  // narrowed, not the whole run
  EXPECT_EQ(doom_text(f), "not found within the step budget (steps " + std::to_string(f.first) + "-" +
                              std::to_string(f.last) + " still suspected)");
  // No room for even the first replay: everything is still suspected.
  ScriptedSteps none(10);
  none.needed = {12};
  none.budget = 0;
  const DoomFinding g = find_dooming_step(none);
  EXPECT_EQ(g.outcome, DoomOutcome::budget_spent);
  EXPECT_EQ(g.first, 10);
  EXPECT_EQ(g.last, 19);
}

TEST(DoomSearch, TheSentenceNamesTheFailingStepForTheViewerAndTheReplayToReadBack) {
  DoomFinding found;
  found.outcome = DoomOutcome::dooming_step;
  found.step = found.first = found.last = 45;
  found.rows = {3};
  const std::string text = doom_sentence(found, 55, "batch row 3 (data set row 363)") + "; 12 replays";
  EXPECT_EQ(
      text,
      "step 45 doomed step 55: without batch row 3 (data set row 363) the steps up to 55 stay finite; 12 replays");
  EXPECT_EQ(format::doomed_step(text), 55);
  EXPECT_EQ(format::doomed_step(doom_sentence(DoomFinding{}, 60, "")), 60) << "no earlier step: about step 60";
  EXPECT_EQ(format::doomed_step("doomed step 12"), std::nullopt) << "no colon: not ours";
  EXPECT_EQ(format::doomed_step("a warning"), std::nullopt);
}
