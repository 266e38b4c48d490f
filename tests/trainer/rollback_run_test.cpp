// Rollback: a saved state comes back bit for bit; a burst of huge samples that
// wrecks the weights of the stock loop is undone; a cause that persists ends
// in the fp32 fallback and then a stop; warnings and rolled-back rows are
// readable from run.h5 alone.
#include <gtest/gtest.h>

#include <torch/optim/adamw.h>

#include <cmath>
#include <sstream>

#include "../support/test_support.hpp"

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/trainer/trainer.hpp"
#include "test_models.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

namespace {

// Median loss of the rows that count, over the last `n` of them.
double final_loss(const format::RunData& run, size_t n = 20) {
  const std::vector<uint8_t> rolled_back = format::rolled_back_rows(run);
  std::vector<double> tail;
  for (size_t i = run.rows(); i-- > 0 && tail.size() < n;)
    if (!rolled_back[i] && !run.skipped[i]) tail.push_back(run.loss[i]);
  return median(tail);
}

std::string burst_run(const test::TempDir& dir, const std::string& name, const std::string& extra) {
  return std::string(test::paths::train_exe) + " --model " + dir.file("relu_regressor.pt") + " --data " +
         dir.file("regressor_data.h5") +
         " --optimizer sgd --lr 0.01 --clip 0 --amp bf16 --steps 300 --quiet --threads 1 --run-dir " + dir.file(name) +
         " " + extra;
}

}  // namespace

TEST(Rollback, ABurstOfHugeSamplesWrecksTheStockLoopAndRollbackUndoesIt) {
  test::TempDir dir;
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  const auto clean = test::run_command(burst_run(dir, "clean", ""));
  const auto off = test::run_command(burst_run(dir, "off", "--rollback off --fault sample_burst@100:1000"));
  const auto on = test::run_command(burst_run(dir, "on", "--fault sample_burst@100:1000"));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;
  ASSERT_EQ(on.exit_code, 0) << on.output;
  const format::RunData clean_run = format::read_run(dir.file("clean/run.h5"));
  const format::RunData off_run = format::read_run(dir.file("off/run.h5"));
  const format::RunData on_run = format::read_run(dir.file("on/run.h5"));
  const double baseline = final_loss(clean_run);

  // The stock loop: the burst's updates wreck the weights, every later step overflows or diverges.
  size_t off_skips = 0;
  for (size_t i = 100; i < off_run.rows(); ++i) off_skips += off_run.skipped[i];
  EXPECT_TRUE(off.exit_code == kExitDeadRun || off_skips > 100 || final_loss(off_run) > 100 * baseline)
      << "the burst did not wreck the stock loop (exit " << off.exit_code << ", " << off_skips << " skips)";

  // Rollback: back to the state saved after step 99, the spiking batches skipped, close to the clean run.
  std::vector<format::RunEvent> rollbacks;
  for (const auto& e : on_run.events)
    if (e.kind == format::EventKind::rollback) rollbacks.push_back(e);
  ASSERT_EQ(rollbacks.size(), 1u) << on.output;
  EXPECT_EQ(format::rollback_target(rollbacks[0].text), 99) << rollbacks[0].text;
  EXPECT_EQ(rollbacks[0].step, 101) << "two trouble steps in a row (patience 2)";
  const std::vector<uint8_t> rolled_back = format::rolled_back_rows(on_run);
  for (size_t i = 0; i < on_run.rows(); ++i)
    EXPECT_EQ(rolled_back[i], on_run.step[i] == 100 || on_run.step[i] == 101) << "step " << on_run.step[i];
  const double recovered = final_loss(on_run);
  EXPECT_LT(recovered, 2 * baseline) << "rollback: " << recovered << ", clean run: " << baseline;
  EXPECT_NE(on.output.find("1 rollback(s)"), std::string::npos) << on.output;
}

TEST(Rollback, ACauseThatPersistsEndsInTheFallbackAndThenAStop) {
  // The LR keeps growing whatever the rollbacks do: 3 rollbacks, the fp32
  // fallback, then the run is dead (exit 4), its file whole.
  test::TempDir dir;
  TrainOptions o = test::quick_mlp_run(dir.file("run"), 400);
  o.amp = Amp::bf16;
  o.faults = {parse_fault("lr_ramp@50:0.2")};
  std::ostringstream log;
  EXPECT_THROW(run(o, log), DeadRunError) << log.str();
  const format::RunData r = format::read_run(dir.file("run/run.h5"));
  int rollbacks = 0, fallbacks = 0, stops = 0;
  for (const auto& e : r.events) {
    rollbacks += e.kind == format::EventKind::rollback;
    fallbacks += e.kind == format::EventKind::fallback;
    stops += e.kind == format::EventKind::stop;
  }
  EXPECT_EQ(rollbacks, 3) << log.str();
  EXPECT_EQ(fallbacks, 1);
  EXPECT_EQ(stops, 1);
  EXPECT_LT(r.rows(), 400u) << "it stops, it does not skip to the end";
}

TEST(Rollback, WeightsThatWentNonFiniteGoBackToTheLastGoodState) {
  // The model writes a NaN into its own weights on a NaN batch at step 30;
  // with a state saved after step 29, the run goes back and on.
  test::TempDir dir;
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  auto r = test::run_command(std::string(test::paths::train_exe) + " --model " + dir.file("poisons_its_weights.pt") +
                             " --data " + dir.file("regressor_data.h5") +
                             " --steps 60 --batch-size 16 --rollback-every 10 --fault nonfinite_input@30:0 --quiet "
                             "--threads 1 --run-dir " +
                             dir.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 30: rollback to step 29:"), std::string::npos) << r.output;
  const format::RunData run = format::read_run(dir.file("run/run.h5"));
  ASSERT_EQ(run.rows(), 60u);
  EXPECT_FALSE(run.skipped[59]);
  EXPECT_TRUE(std::isfinite(run.loss[59]));
}
