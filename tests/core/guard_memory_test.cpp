// What forensics, recovery and the doom search each keep between steps,
// without a guard around them: which transitions change it, and how.
#include <gtest/gtest.h>

#include <torch/optim/adamw.h>

#include "../support/tiny_models.hpp"
#include "nanscope/core/doom_memory.hpp"
#include "nanscope/core/forensics_memory.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/recovery_memory.hpp"

using namespace nanscope;

namespace {

GuardOptions with_backoff(double lr_backoff) {
  GuardOptions o;
  o.lr_backoff = lr_backoff;
  o.fallback = FallbackMode::whole;
  return o;
}

StepRecord record_of(int64_t step) {
  StepRecord r;
  r.step = step;
  return r;
}

std::vector<int64_t> steps_of(const std::vector<const StepRecord*>& records) {
  std::vector<int64_t> out;
  for (const StepRecord* r : records) out.push_back(r->step);
  return out;
}

}  // namespace

TEST(RecoveryMemory, CountsARunOfFailedStepsFromItsFirstUntilAFiniteStep) {
  RecoveryMemory memory(with_backoff(0.5));
  memory.count_nonfinite(7);
  memory.count_nonfinite(8);
  EXPECT_EQ(memory.nonfinite_in_a_row(), 2);
  EXPECT_EQ(memory.nonfinite_since(), 7);
  memory.finite_step();
  EXPECT_EQ(memory.nonfinite_in_a_row(), 0);
  memory.count_nonfinite(12);
  EXPECT_EQ(memory.nonfinite_since(), 12);
}

TEST(RecoveryMemory, ARollbackCutsTheLrAndForgetsLaterStatesAReplayWithoutTheDoomerDoesNotCut) {
  auto model = test::tiny_mlp();
  torch::optim::AdamW optimizer(trainable_tensors(*model), torch::optim::AdamWOptions(1e-2));
  const LossScaler scaler;
  RecoveryMemory memory(with_backoff(0.25));
  for (int64_t step : {2, 4, 6}) {
    memory.applied(step);
    ASSERT_TRUE(memory.save(step, *model, optimizer, scaler));
  }
  memory.count_nonfinite(8);

  memory.rolled_back(/*to=*/4, /*step=*/9);
  EXPECT_EQ(memory.last_applied_step(), 4);
  EXPECT_DOUBLE_EQ(memory.lr_cut(), 0.25);
  EXPECT_EQ(memory.rollback().rollbacks(), 1);
  EXPECT_EQ(memory.nonfinite_in_a_row(), 0);
  ASSERT_NE(memory.saved_states().newest_before(100), nullptr);
  EXPECT_EQ(memory.saved_states().newest_before(100)->step, 4);

  memory.applied(10);
  const int64_t applied = memory.applied_steps();
  memory.replayed_without(/*dooming_step=*/4, /*step=*/11, /*whole_update=*/true);
  EXPECT_EQ(memory.applied_steps(), applied - 1) << "the dooming step's update is gone";
  EXPECT_EQ(memory.last_applied_step(), 10);
  EXPECT_DOUBLE_EQ(memory.lr_cut(), 0.25);
  EXPECT_EQ(memory.rollback().rollbacks(), 2);
  EXPECT_EQ(memory.saved_states().newest_before(100)->step, 2);
}

TEST(RecoveryMemory, TheFallbacksCutIsPartOfTheOneCutAndSurvivesACheckpoint) {
  auto model = test::tiny_mlp();
  torch::optim::AdamW optimizer(trainable_tensors(*model), torch::optim::AdamWOptions(1e-2));
  LossScaler scaler;
  RecoveryMemory memory(with_backoff(0.5));
  memory.fall_back(*model, optimizer, scaler, at::kCPU, 3);
  EXPECT_EQ(memory.amp(), Amp::fp32);
  memory.add_fp32_modules({"norm"});
  memory.rolled_back(-1, 5);
  EXPECT_DOUBLE_EQ(memory.lr_cut(), 0.25);
  memory.applied(6);
  GuardState saved;
  memory.write_to(saved);
  EXPECT_EQ(saved.fallback_step, 3);
  EXPECT_EQ(saved.rollbacks, 1);

  RecoveryMemory resumed(with_backoff(0.5));
  resumed.restore(saved, *model, optimizer, scaler, at::kCPU);
  EXPECT_EQ(resumed.fallback().fired_step(), 3);
  EXPECT_DOUBLE_EQ(resumed.lr_cut(), 0.25);
  EXPECT_EQ(resumed.rollback().rollbacks(), 1);
  EXPECT_EQ(resumed.amp(), Amp::fp32);
  EXPECT_EQ(resumed.fp32_modules(), std::vector<std::string>{"norm"});
  EXPECT_EQ(resumed.applied_steps(), 1);
  EXPECT_EQ(resumed.last_applied_step(), 6);

  // Before format 1.7 the field held the rollbacks' cut alone.
  GuardState old = saved;
  old.lr_multiplier = 0.5;
  old.lr_multiplier_lacks_fallback = true;
  RecoveryMemory from_old(with_backoff(0.5));
  from_old.restore(old, *model, optimizer, scaler, at::kCPU);
  EXPECT_DOUBLE_EQ(from_old.lr_cut(), 0.25);
}

TEST(DoomMemory, KeepsTheStepsAfterTheOldestSavedStateAndForgetsAnUndoneFuture) {
  DoomMemory memory(1 << 20);
  for (int64_t step = 0; step < 6; ++step) memory.record(record_of(step), /*oldest_saved=*/step >= 3 ? 2 : -1);
  EXPECT_EQ(steps_of(memory.steps_between(2, 6)), (std::vector<int64_t>{3, 4, 5}));

  DoomFinding finding;
  finding.outcome = DoomOutcome::dooming_step;
  finding.step = 4;
  memory.found(6, finding);
  ASSERT_NE(memory.still_explains(2), nullptr);
  EXPECT_EQ(memory.still_explains(2)->at_step, 6);
  EXPECT_EQ(memory.still_explains(4), nullptr);  // a state saved after the blamed update

  memory.forget_from(4);  // the run went back to before step 4
  EXPECT_EQ(steps_of(memory.steps_between(2, 6)), (std::vector<int64_t>{3}));
  EXPECT_EQ(memory.still_explains(2), nullptr);
}

TEST(ForensicsMemory, RemembersTheFirstNonfiniteRanksAndEachBirthsRemedy) {
  ForensicsMemory memory(4);
  EXPECT_FALSE(memory.nonfinite_ranks({}));
  EXPECT_TRUE(memory.nonfinite_ranks({1}));
  EXPECT_FALSE(memory.nonfinite_ranks({0, 1}));
  EXPECT_EQ(memory.first_nonfinite_ranks(), (std::vector<int>{1}));

  RemedyChoice remedy;
  remedy.remedy = Remedy::skip_data;
  memory.remember("", 3, remedy);  // no birth: nothing to know it by
  memory.remember("nan|aten::mul|fc1", 3, remedy);
  EXPECT_EQ(memory.diagnosed("", [] { return std::vector<uint64_t>{}; }), nullptr);
  EXPECT_EQ(memory.diagnosed("nan|aten::mul|fc2", [] { return std::vector<uint64_t>{}; }), nullptr);
  ASSERT_NE(memory.diagnosed("nan|aten::mul|fc1", [] { return std::vector<uint64_t>{}; }), nullptr);
  EXPECT_EQ(memory.diagnosed("nan|aten::mul|fc1", [] { return std::vector<uint64_t>{}; })->step, 3);
  EXPECT_EQ(memory.diagnosed("nan|aten::mul|fc1", [] { return std::vector<uint64_t>{}; })->remedy.remedy,
            Remedy::skip_data);
}

// A diagnosis that named its trigger samples is the same fault again only
// where the step's birth names one of them: the same op on another sample is
// a new fault, diagnosed anew.
TEST(ForensicsMemory, ADiagnosisWithTriggerSamplesMatchesOnlyThoseSamples) {
  ForensicsMemory memory(4);
  RemedyChoice remedy;
  remedy.remedy = Remedy::skip_model_or_data;
  remedy.trigger_samples = {17};
  memory.remember("inf|aten::log|", 5, remedy);
  EXPECT_EQ(memory.diagnosed("inf|aten::log|", [] { return std::vector<uint64_t>{3, 4}; }), nullptr);
  const ForensicsMemory::Diagnosed* again = memory.diagnosed("inf|aten::log|", [] {
    return std::vector<uint64_t>{3, 17};
  });
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->step, 5);
  remedy.trigger_samples = {4};  // the same op triggered by another sample: remembered beside it
  memory.remember("inf|aten::log|", 9, remedy);
  EXPECT_EQ(memory.diagnosed("inf|aten::log|", [] { return std::vector<uint64_t>{4}; })->step, 9);
  bool asked = false;
  EXPECT_EQ(memory.diagnosed("nan|aten::div|",
                             [&] {
                               asked = true;
                               return std::vector<uint64_t>{17};
                             }),
            nullptr);
  EXPECT_FALSE(asked) << "no diagnosis of that birth: its samples are not read";
}
