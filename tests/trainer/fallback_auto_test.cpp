// --fallback auto and --fp32-modules on whole runs with planted faults, and
// the schedule on skipped steps.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "../support/test_support.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/trainer/trainer.hpp"
#include "test_models.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

namespace {

TrainOptions faulted_gpt(const std::string& run_dir, FallbackMode mode, const std::string& faults) {
  TrainOptions o;
  o.model = "gpt";
  o.steps = 14;
  o.batch_size = 8;
  o.lr = 1e-3;
  o.amp = Amp::bf16;
  o.shuffle = false;
  o.fallback = mode;
  o.run_dir = run_dir;
  o.quiet = true;
  o.threads = 1;
  for (std::stringstream list(faults); !list.eof();) {
    std::string item;
    std::getline(list, item, ',');
    o.faults.push_back(parse_fault(item));
  }
  return o;
}

}  // namespace

TEST(FallbackAuto, APrecisionFailurePutsOnlyItsModulesInFp32AndTheRunStaysBf16) {
  // The bf16-only variance cancellation in blocks.0.ln1, planted twice.
  test::TempDir dir;
  std::ostringstream log;
  const TrainSummary whole =
      run(faulted_gpt(dir.file("whole"), FallbackMode::whole, "variance_cancellation@4,variance_cancellation@9"), log);
  const TrainSummary automatic = run(
      faulted_gpt(dir.file("auto"), FallbackMode::automatic, "variance_cancellation@4,variance_cancellation@9"), log);
  EXPECT_EQ(whole.fallback_step, 4);
  EXPECT_EQ(automatic.fallback_step, -1) << log.str();
  EXPECT_EQ(automatic.skipped, 1) << "with blocks.0.ln1 in fp32 the second planting is finite";

  const format::RunData run_file = format::read_run(dir.file("auto/run.h5"));
  const auto remedies = test::events_of(run_file, format::EventKind::remedy);
  ASSERT_EQ(remedies.size(), 1u) << log.str();
  EXPECT_EQ(remedies[0].step, 4);
  EXPECT_EQ(remedies[0].text.rfind("fp32-modules: blocks.0.ln1 now in fp32", 0), 0u) << remedies[0].text;
  EXPECT_TRUE(test::events_of(run_file, format::EventKind::fallback).empty());
  for (size_t i = 0; i < run_file.rows(); ++i)
    EXPECT_EQ(run_file.amp[i], uint8_t(Amp::bf16)) << "row " << i << ": the rest of the model stays bf16";
  EXPECT_FALSE(run_file.skipped[9]);
}

TEST(FallbackAuto, ANonFiniteSampleSkipsWithoutTheFallbackOrAnLrCut) {
  test::TempDir dir;
  std::ostringstream log;
  TrainOptions o = test::quick_mlp_run(dir.file("auto"), 12);
  o.amp = Amp::bf16;
  o.fallback = FallbackMode::automatic;
  o.faults = {parse_fault("nonfinite_input@4:3")};
  const TrainSummary s = run(o, log);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.fallback_step, -1);
  EXPECT_DOUBLE_EQ(s.final_lr, o.lr);
  const format::RunData run_file = format::read_run(dir.file("auto/run.h5"));
  const auto remedies = test::events_of(run_file, format::EventKind::remedy);
  ASSERT_EQ(remedies.size(), 1u);
  EXPECT_EQ(remedies[0].text.rfind("data: ", 0), 0u) << remedies[0].text;
}

TEST(FallbackAuto, PlannedFp32ModulesKeepTheFaultedStepFinite) {
  test::TempDir dir;
  std::ostringstream log;
  TrainOptions o = faulted_gpt(dir.file("planned"), FallbackMode::whole, "variance_cancellation@4");
  o.fp32_modules = {"blocks.0.ln1"};
  const TrainSummary s = run(o, log);
  EXPECT_EQ(s.skipped, 0) << log.str();
  EXPECT_EQ(s.fallback_step, -1);
}

TEST(FallbackAuto, AnFp32ModuleTheModelDoesNotHaveIsABadInput) {
  test::TempDir dir;
  const auto r = test::run_command(std::string(test::paths::train_exe) +
                                   " --model gpt --steps 3 --amp bf16 --quiet --threads 1 --fp32-modules "
                                   "blocks.0.ln1,blocks.0.lnX --run-dir " +
                                   dir.file("run"));
  EXPECT_EQ(r.exit_code, kExitBadInput) << r.output;
  EXPECT_NE(r.output.find("--fp32-modules blocks.0.lnX: no module blocks.0.lnX ran in the step"), std::string::npos)
      << r.output;
}

TEST(Schedule, HoldKeepsASkippedStepFromMovingTheSchedule) {
  // Warmup over 10 steps with a NaN sample at step 3: held, step 4 runs at
  // step 3's LR (3 updates done); advanced, at step 4's.
  test::TempDir dir;
  std::ostringstream log;
  auto lrs_of = [&](bool hold, const std::string& name) {
    TrainOptions o = test::quick_mlp_run(dir.file(name), 8);
    o.schedule = Schedule::cosine;
    o.warmup = 5;
    o.fallback = FallbackMode::off;
    o.schedule_holds_on_skip = hold;
    o.faults = {parse_fault("nonfinite_input@3")};
    run(o, log);
    return format::read_run(dir.file(name + "/run.h5")).lr;
  };
  const std::vector<double> held = lrs_of(true, "hold"), advanced = lrs_of(false, "advance");
  ASSERT_EQ(held.size(), 8u);
  EXPECT_DOUBLE_EQ(held[4], held[3]);
  EXPECT_DOUBLE_EQ(held[4], advanced[3]);
  EXPECT_GT(advanced[4], advanced[3]);
  EXPECT_DOUBLE_EQ(held[5], advanced[4]);
}
