// A corrupt sample (a data set row that reads as NaN every time it is read)
// under --fallback auto: skipped once, listed in the run's poison list, and
// left out of every later epoch, by the run and by a resumed run; the stock
// fallback meets it every epoch. A list a person edits is honoured: a line
// deleted brings its sample back, a line edited wrong is an error naming it.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "../support/test_support.hpp"
#include "nanscope/common/exit_codes.hpp"
#include "nanscope/format/poison_list.hpp"
#include "nanscope/format/run_file.hpp"

using namespace nanscope;

namespace {

// The mlp on its built-in 4096 samples, 16 a batch: 256 steps an epoch.
constexpr int64_t kStepsPerEpoch = 256;
constexpr int64_t kCorruptRow = 5;

std::string train(const std::string& run_dir, const std::string& extra) {
  return std::string(test::paths::train_exe) +
         " --model mlp --amp bf16 --threads 1 --quiet --fault corrupt_sample@0:" + std::to_string(kCorruptRow) +
         " --run-dir " + run_dir + " " + extra;
}

std::vector<int64_t> skipped_steps(const std::string& run_file) {
  const format::RunData run = format::read_run(run_file, format::LayerTables::skip);
  std::vector<int64_t> steps;
  for (size_t i = 0; i < run.rows(); ++i)
    if (run.skipped[i]) steps.push_back(run.step[i]);
  return steps;
}

}  // namespace

TEST(PoisonRun, ACorruptSampleIsSkippedOnceAndLeftOutOfEveryLaterEpoch) {
  test::TempDir dir;
  const int64_t steps = 4 * kStepsPerEpoch;
  // The stock fallback lists nothing: the sample is met, and skipped, once an epoch.
  const auto stock = test::run_command(train(dir.file("stock"), "--fallback whole --steps " + std::to_string(steps)));
  ASSERT_EQ(stock.exit_code, kExitOk) << stock.output;
  EXPECT_EQ(skipped_steps(dir.file("stock/run.h5")).size(), 4u) << stock.output;
  EXPECT_TRUE(format::read_poison_list(format::poison_list_path(dir.file("stock"))).empty());

  const auto r = test::run_command(train(dir.file("auto"), "--fallback auto --steps " + std::to_string(steps)));
  ASSERT_EQ(r.exit_code, kExitOk) << r.output;
  const std::vector<int64_t> skipped = skipped_steps(dir.file("auto/run.h5"));
  ASSERT_EQ(skipped.size(), 1u) << r.output;
  EXPECT_LT(skipped[0], kStepsPerEpoch) << "met in the first epoch, never again";
  const std::vector<format::PoisonedSample> list = format::read_poison_list(format::poison_list_path(dir.file("auto")));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].row, kCorruptRow);
  EXPECT_EQ(list[0].step, skipped[0]);
  EXPECT_NE(list[0].why.find("the batch holds a non-finite value"), std::string::npos) << list[0].why;
  EXPECT_NE(r.output.find("data set row 5 left out from the next epoch on"), std::string::npos) << r.output;

  // nanscope-report says what the run leaves out.
  const auto report = test::run_command(std::string(test::paths::report_exe) + " " + dir.file("auto"));
  EXPECT_NE(report.output.find("left out: 1 sample since step " + std::to_string(skipped[0]) + ": data set row 5"),
            std::string::npos)
      << report.output;
}

TEST(PoisonRun, AResumedRunLeavesOutASampleListedBeforeTheKill) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const auto first = test::run_command(train(run_dir, "--fallback auto --checkpoint-every 100 --steps 300"));
  ASSERT_EQ(first.exit_code, kExitOk) << first.output;
  ASSERT_EQ(skipped_steps(run_dir + "/run.h5").size(), 1u) << first.output;
  const auto resumed = test::run_command(std::string(test::paths::train_exe) + " --resume " + run_dir +
                                         " --quiet --steps " + std::to_string(5 * kStepsPerEpoch));
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.output;
  const std::vector<int64_t> skipped = skipped_steps(run_dir + "/run.h5");
  ASSERT_EQ(skipped.size(), 1u) << "four more epochs, the sample in none of them: " << resumed.output;
  EXPECT_LT(skipped[0], 300);
}

TEST(PoisonRun, ADeletedLineBringsItsSampleBackAndAWrongLineIsAnError) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  ASSERT_EQ(test::run_command(train(run_dir, "--fallback auto --checkpoint-every 300 --steps 300")).exit_code, kExitOk);
  const std::string list = format::poison_list_path(run_dir);
  // Edited wrong: the resumed run refuses to guess which samples to leave out.
  std::ofstream(list) << "{\"row\": five, \"step\": 3}\n";
  const auto wrong =
      test::run_command(std::string(test::paths::train_exe) + " --resume " + run_dir + " --quiet --steps 600");
  EXPECT_EQ(wrong.exit_code, kExitBadInput) << wrong.output;
  EXPECT_NE(wrong.output.find(list), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("line 1"), std::string::npos) << wrong.output;
  // Emptied (the line deleted): the sample is met again in the next epoch, and listed again.
  std::ofstream(list, std::ios::trunc).flush();
  const auto restored =
      test::run_command(std::string(test::paths::train_exe) + " --resume " + run_dir + " --quiet --steps 600");
  ASSERT_EQ(restored.exit_code, kExitOk) << restored.output;
  const std::vector<int64_t> skipped = skipped_steps(run_dir + "/run.h5");
  ASSERT_EQ(skipped.size(), 2u) << restored.output;
  EXPECT_GE(skipped[1], kStepsPerEpoch);
  EXPECT_EQ(format::read_poison_list(list).size(), 1u);
}
