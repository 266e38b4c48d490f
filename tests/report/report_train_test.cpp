// nanscope-report on real nanscope-train runs: a planted NaN in a batch row
// named as the run's skip, first birth and snapshot, the row traced to the
// data set; and a training run followed live to its end.
#include <gtest/gtest.h>

#include <filesystem>

#include "nanscope/format/run_file.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "report_support.hpp"

using namespace nanscope;
using test::has_line;
using test::report_tool;
using test::TempDir;

namespace {

const std::string kTrain = test::paths::train_exe;

// A NaN planted in batch row 2 of step 5, in bf16.
std::string train_command(const std::string& run_dir, int steps) {
  return kTrain + " --model mlp --steps " + std::to_string(steps) +
         " --batch-size 8 --lr 0.01 --amp bf16 --fault nonfinite_input@5:2 --threads 1 --quiet --run-dir " + run_dir;
}

}  // namespace

TEST(ReportTrain, NamesTheSkipTheInputBirthAndTheSnapshotOfARealRun) {
  TempDir dir;
  const std::string run = dir.file("run");
  const auto trained = test::run_command(train_command(run, 12));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string snapshot = run + "/snapshots/step-0000005.h5";
  ASSERT_TRUE(std::filesystem::exists(snapshot)) << trained.output;
  // Where batch row 2 came from, as the trainer recorded it.
  const format::SnapshotSummary written = format::read_snapshot_summary(snapshot);
  ASSERT_EQ(written.batch_rows.size(), 8u);
  const int64_t dataset_row = written.batch_rows[2];
  ASSERT_GE(dataset_row, 0);

  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string& out = r.output;
  // Who ran the loop is what the file says (@origin, format 1.2; "unknown" where the writer left it unset).
  const format::Origin origin = format::read_run(run + "/run.h5").origin;
  EXPECT_TRUE(has_line(out, "  file        " + run + "/run.h5 (format " + test::format_version_text() + ", origin " +
                                format::to_string(origin) + ")"))
      << out;
  EXPECT_NE(out.find("\n  config      model mlp, amp bf16, optimizer "), std::string::npos) << out;
  EXPECT_NE(out.find("\n  steps       12 recorded (steps 0-11): 11 counted, 1 skipped\n"), std::string::npos) << out;
  // The stock loop's one-shot fallback at the skip: fp32 from the next step on.
  EXPECT_TRUE(has_line(out, "  amp         bf16 (steps 0-5), fp32 (steps 6-11); fp32 from step 6")) << out;
  EXPECT_TRUE(has_line(out, "fallbacks and remedies (1)")) << out;
  EXPECT_TRUE(has_line(out, "skips (1)")) << out;
  EXPECT_NE(out.find("\n  step 5  skip  non-finite loss at bf16; optimizer step skipped"), std::string::npos) << out;
  EXPECT_TRUE(has_line(out, "first births (1)")) << out;
  EXPECT_TRUE(has_line(out, "  step 5  first_birth  nan at input (input) in module '', batch row 2")) << out;
  EXPECT_TRUE(has_line(out, "snapshots (1)")) << out;
  EXPECT_TRUE(has_line(out, "  step 5 (bf16): " + snapshot)) << out;
  EXPECT_TRUE(has_line(out, "    first birth: nan at input (input) in module '', batch row 2")) << out;
  EXPECT_TRUE(has_line(out, "    non-finite: batch row 2 (data set row " + std::to_string(dataset_row) + ")")) << out;
  EXPECT_TRUE(has_line(out, "    replay: not replayed yet (nanscope-replay " + snapshot + ")")) << out;

  const std::string json = dir.file("report.json");
  ASSERT_EQ(report_tool("--json " + run + " > " + json).exit_code, 0);
  EXPECT_EQ(test::python_json(json,
                              "d[\"runs\"][0][\"origin\"], d[\"runs\"][0][\"summary\"][\"skipped\"], "
                              "d[\"runs\"][0][\"event_counts\"][\"first_birth\"], "
                              "d[\"runs\"][0][\"snapshots\"][0][\"first_birth\"][\"phase\"], "
                              "d[\"runs\"][0][\"snapshots\"][0][\"nonfinite_rows\"]"),
            std::string(format::to_string(origin)) +
                " 1 1 input [{'batch_row': 2, 'dataset_row': " + std::to_string(dataset_row) + "}]\n");
}

TEST(ReportTrain, FollowsATrainingRunAsItIsWrittenUntilItEnds) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);  // the report waits in it for run.h5
  // The trainer in the background, the report following it; the shell waits for both.
  const auto r = test::run_command("sh -c '" + train_command(run, 300) + " > " + dir.file("train.log") + " 2>&1 & " +
                                   test::kReport + " --follow --interval 0.5 --until-idle 120 " + run +
                                   "; status=$?; wait; exit $status'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nstep 5  skip  non-finite loss at bf16; optimizer step skipped"), std::string::npos)
      << r.output;
  EXPECT_TRUE(has_line(r.output, "step 5  first_birth  nan at input (input) in module '', batch row 2")) << r.output;
  EXPECT_TRUE(has_line(r.output, "following ended: its writer closed " + run + "/run.h5")) << r.output;
  EXPECT_NE(r.output.find("\n  steps       300 recorded (steps 0-299): 299 counted, 1 skipped\n"), std::string::npos)
      << r.output;
  EXPECT_TRUE(has_line(r.output, "  step 5 (bf16): " + run + "/snapshots/step-0000005.h5")) << r.output;
}
