// nanscope-train --search-doom RUN_DIR: the search for the step that doomed a
// run, after the run, from its kept checkpoints. A one-step LR pulse (finite,
// applied) wrecks a small gpt's weights and the next step is non-finite: the
// search must name the pulse's step, its whole update (no row), and an
// innocent run (a fault in the failing step's own op) must blame no step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../support/json_check.hpp"
#include "../support/test_support.hpp"

using nanscope::test::run_command;
using nanscope::test::TempDir;

namespace {

const std::string kTrain = nanscope::test::paths::train_exe;
// Small and quick: one block of width 32, bf16, no rollback (the run goes on
// skipping), a checkpoint every 10 steps kept by step.
const std::string kRun = kTrain +
                         " --model gpt --n-layer 1 --n-embd 32 --amp bf16 --rollback off --threads 1 "
                         "--checkpoint-every 10 --keep-checkpoints 2 --quiet";

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

TEST(DoomOffline, NamesTheLrPulseStepFromAKeptCheckpointAndWritesNothing) {
  TempDir dir;
  const std::string run = dir.file("run");
  auto trained = run_command(kRun + " --steps 24 --fault lr_pulse@15:1e12 --run-dir " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_TRUE(std::filesystem::exists(run + "/checkpoint.step-0000010.h5")) << trained.output;
  const std::string before = file_bytes(run + "/run.h5");

  // The run's own options come from RUN_DIR/options.toml (the model sizes included).
  auto r = run_command(kTrain + " --search-doom " + run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("search-doom: step 16 of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(the state after step 9), 6 steps before step 16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("search-doom: replay 1, without steps 10-15;"), std::string::npos) << "progress\n"
                                                                                             << r.output;
  // An LR pulse is the step's whole update, not one of its rows.
  EXPECT_NE(r.output.find("doomed by: step 15 doomed step 16: without its update the steps up to 16 stay finite"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(file_bytes(run + "/run.h5"), before) << "the search writes nothing into the run";

  // --json: the same finding as one JSON object on stdout (the progress stays on stderr).
  const std::string json = dir.file("found.json");
  auto as_json =
      run_command("(" + kTrain + " --search-doom " + run + " --json 2> " + dir.file("progress.log") + ") > " + json);
  ASSERT_EQ(as_json.exit_code, 0) << as_json.output;
  EXPECT_EQ(nanscope::test::python_json(
                json, "d[\"outcome\"], d[\"failing_step\"], d[\"step\"], d[\"rows\"], d[\"text\"][:7]"),
            "dooming_step 16 15 [] step 15\n");

  // A budget too small for the bisection names the steps still suspected.
  auto spent = run_command(kTrain + " --search-doom " + run + " --doom-budget 10");
  ASSERT_EQ(spent.exit_code, 0) << spent.output;
  EXPECT_NE(spent.output.find("doomed by: not found within the step budget (steps 10-15 still suspected)"),
            std::string::npos)
      << spent.output;
}

TEST(DoomOffline, AFailureOfTheStepsOwnOpBlamesNoEarlierStep) {
  TempDir dir;
  const std::string run = dir.file("run");
  auto trained = run_command(kRun + " --steps 24 --fault exp_overflow@16 --run-dir " + run);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  auto r = run_command(kTrain + " --search-doom " + run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("doomed by: no earlier step doomed step 16: non-finite with every update since the saved "
                          "state left out; 1 replay from "),
            std::string::npos)
      << r.output;
}

TEST(DoomOffline, WhatCannotBeSearchedExitsTwoSayingWhy) {
  TempDir dir;
  // A healthy run: nothing to explain.
  const std::string healthy = dir.file("healthy");
  ASSERT_EQ(run_command(kRun + " --steps 12 --run-dir " + healthy).exit_code, 0);
  auto none = run_command(kTrain + " --search-doom " + healthy);
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("has no non-finite step to explain (name the step to explain)"), std::string::npos)
      << none.output;
  // A step whose own batch holds the NaN (float inputs: the mlp) has no earlier cause.
  const std::string nan_batch = dir.file("nan_batch");
  ASSERT_EQ(run_command(kTrain +
                        " --model mlp --steps 12 --threads 1 --checkpoint-every 10 --quiet "
                        "--fault nonfinite_input@11 --run-dir " +
                        nan_batch)
                .exit_code,
            0);
  auto own = run_command(kTrain + " --search-doom " + nan_batch);
  EXPECT_EQ(own.exit_code, 2) << own.output;
  EXPECT_NE(own.output.find("its own batch is the cause, no earlier step"), std::string::npos) << own.output;
  // Checkpoints only after the failing step.
  auto early = run_command(kTrain + " --search-doom " + nan_batch + " --failing-step 5");
  EXPECT_EQ(early.exit_code, 2) << early.output;
  EXPECT_NE(early.output.find("no checkpoint kept from before step 5"), std::string::npos) << early.output;
  // Not a run directory at all.
  auto missing = run_command(kTrain + " --search-doom " + dir.file("nowhere"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
}
