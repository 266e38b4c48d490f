// Early warnings come before the NaN and never on a clean run; a run whose
// weights went non-finite stops.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "../support/test_support.hpp"

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/core/sentinel.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/trainer/trainer.hpp"
#include "test_models.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

namespace {

struct Timeline {
  int64_t first_warning = -1, first_nonfinite = -1, warnings = 0;
};

Timeline timeline_of(const std::string& run_file) {
  const format::RunData r = format::read_run(run_file);
  Timeline t;
  for (size_t i = 0; i < r.rows(); ++i)
    if (r.skipped[i] && t.first_nonfinite < 0) t.first_nonfinite = r.step[i];
  for (const auto& e : r.events)
    if (e.kind == format::EventKind::warning) {
      ++t.warnings;
      if (t.first_warning < 0 || e.step < t.first_warning) t.first_warning = e.step;
    }
  return t;
}

TrainOptions ramp_run(const std::string& run_dir, const std::string& fault, int64_t steps) {
  TrainOptions o = test::quick_mlp_run(run_dir, steps);
  o.amp = Amp::bf16;
  o.faults = {parse_fault(fault)};
  o.rollback.enabled = false;  // lead time is measured to the first non-finite step; what follows is rollback's test
  o.max_nonfinite_run = 0;     // and the dead-run stop's (DeadRun tests)
  return o;
}

// nanscope-train on one of the TorchScript fixtures (make_scripted_model.py,
// written into `dir`) and its regressor data, into dir/run.
test::CommandResult train_fixture(const test::TempDir& dir, const std::string& model, const std::string& flags) {
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  EXPECT_EQ(fixture.exit_code, 0) << fixture.output;
  return test::run_command(std::string(test::paths::train_exe) + " --model " + dir.file(model) + " --data " +
                           dir.file("regressor_data.h5") + " " + flags + " --quiet --threads 1 --run-dir " +
                           dir.file("run"));
}

}  // namespace

TEST(SentinelRun, WarnsTenStepsOrMoreBeforeAnLrRampMakesItNonFinite) {
  test::TempDir dir;
  std::ostringstream log;
  TrainSummary s = run(ramp_run(dir.file("run"), "lr_ramp@50:0.2", 250), log);
  const Timeline t = timeline_of(s.run_file);
  ASSERT_GE(t.first_nonfinite, 0) << "the ramp must end in a non-finite step";
  ASSERT_GE(t.first_warning, 0) << log.str();
  EXPECT_GE(t.first_nonfinite - t.first_warning, 10) << log.str();
  EXPECT_GE(t.first_warning, 50) << "no warning before the ramp starts:\n" << log.str();
  EXPECT_NE(log.str().find("warning: grad_norm"), std::string::npos) << log.str();
}

TEST(SentinelRun, WarnsTenStepsOrMoreBeforeGrowingInputsOverflow) {
  test::TempDir dir;
  std::ostringstream log;
  TrainSummary s = run(ramp_run(dir.file("run"), "input_ramp@50:0.3", 300), log);
  const Timeline t = timeline_of(s.run_file);
  ASSERT_GE(t.first_nonfinite, 0);
  ASSERT_GE(t.first_warning, 50) << log.str();
  EXPECT_GE(t.first_nonfinite - t.first_warning, 10) << log.str();
  EXPECT_NE(log.str().find("activation_headroom in 'inputs'"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("steps"), std::string::npos) << "the predicted steps to the limit";
}

TEST(SentinelRun, CleanRunsRaiseNoWarning) {
  test::TempDir dir;
  TrainOptions mlp = test::quick_mlp_run(dir.file("mlp"), 2000);
  mlp.amp = Amp::bf16;
  mlp.act_absmax_every = 10;
  std::ostringstream log;
  EXPECT_EQ(timeline_of(run(mlp, log).run_file).warnings, 0) << log.str();

  TrainOptions gpt = mlp;
  gpt.model = "gpt";
  gpt.steps = 200;
  gpt.batch_size = 8;
  gpt.run_dir = dir.file("gpt");
  EXPECT_EQ(timeline_of(run(gpt, log).run_file).warnings, 0) << log.str();
}

TEST(SentinelRun, WarnOffWritesNoWarning) {
  test::TempDir dir;
  TrainOptions o = ramp_run(dir.file("run"), "lr_ramp@50:0.2", 200);
  o.warn = false;
  std::ostringstream log;
  EXPECT_EQ(timeline_of(run(o, log).run_file).warnings, 0);
}

TEST(DeadRun, WeightsThatWentNonFiniteStopTheRunWithExitFour) {
  // The model writes a NaN batch statistic into its own gain parameter at
  // step 3: skipping the step cannot save weights that are already NaN.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  auto r = train_fixture(dir, "poisons_its_weights.pt", "--steps 40 --batch-size 16 --fault nonfinite_input@3:0");
  EXPECT_EQ(r.exit_code, kExitDeadRun) << r.output;
  EXPECT_NE(r.output.find("step 3: the training state is non-finite (parameter gain; the last update that reached "
                          "the weights: step 2)"),
            std::string::npos)
      << r.output;
  const format::RunData run = format::read_run(run_dir + "/run.h5");  // closed whole
  EXPECT_EQ(run.rows(), 4u) << "it stops at the step that found them, not after 40";
  bool stop_event = false;
  for (const auto& e : run.events) stop_event |= e.kind == format::EventKind::stop;
  EXPECT_TRUE(stop_event);
}

TEST(DeadRun, FiniteButWreckedWeightsStopAfterARunOfNonFiniteStepsWithNothingLeftToTry) {
  // A burst of huge samples through SGD without clipping leaves the weights
  // finite and wrecked: after the fp32 fallback every step overflows. With
  // rollback off nothing is left to try, and the run stops after
  // --max-nonfinite-run of them, naming the step the trouble began at.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  auto r = train_fixture(dir, "relu_regressor.pt",
                         "--config " + std::string(test::paths::samples) +
                             "/faults/sample-burst.toml --rollback off --max-nonfinite-run 15");
  EXPECT_EQ(r.exit_code, kExitDeadRun) << r.output;
  const format::RunData run = format::read_run(run_dir + "/run.h5");
  // The first non-finite step of the run, read from the run itself.
  size_t began = 0;
  while (began < run.rows() && !run.skipped[began]) ++began;
  ASSERT_LT(began, run.rows()) << "the burst never made a step non-finite";
  ASSERT_EQ(run.rows(), began + 15) << "it stops at the 15th non-finite step in a row";
  for (size_t i = began; i < run.rows(); ++i) EXPECT_EQ(run.skipped[i], 1) << "step " << run.step[i];
  EXPECT_NE(r.output.find("non-finite on 15 steps in a row; the trouble began at step " +
                          std::to_string(run.step[began]) + " (after the fp32 fallback, rollback off)"),
            std::string::npos)
      << r.output;
}

TEST(DeadRun, AHealthyRunSkipsAndGoesOnAsBefore) {
  // The stock semantics where the weights are intact: skip, fall back, go on.
  test::TempDir dir;
  TrainOptions o = test::quick_mlp_run(dir.file("run"), 20);
  o.faults = {parse_fault("nonfinite_input@5:0")};
  std::ostringstream log;
  TrainSummary s = run(o, log);
  EXPECT_EQ(s.steps_run, 20);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.fallback_step, 5);
}
