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

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a.cpu(), b.cpu());
}

NamedTensors snapshot_of(const TrainableModel& model, const torch::optim::Optimizer& optimizer) {
  NamedTensors out;
  for (const auto& [name, t] : model.named_parameters()) out.emplace_back(name, t.detach().clone());
  for (const auto& [name, t] : model.named_buffers()) out.emplace_back(name, t.clone());
  for (const auto& [name, t] : optimizer_state_by_name(optimizer, model.named_parameters()))
    out.emplace_back(name, t.clone());
  return out;
}

// Median loss of the rows that count, over the last `n` of them.
double final_loss(const format::RunData& run, size_t n = 20) {
  const std::vector<uint8_t> rolled_back = format::rolled_back_rows(run);
  std::vector<double> tail;
  for (size_t i = run.rows(); i-- > 0 && tail.size() < n;)
    if (!rolled_back[i] && !run.skipped[i]) tail.push_back(run.loss[i]);
  return median(tail);
}

std::string burst_run(const test::TempDir& dir, const std::string& name, const std::string& extra) {
  return std::string(NANSCOPE_TRAIN_EXE) + " --model " + dir.file("relu_regressor.pt") + " --data " +
         dir.file("regressor_data.h5") +
         " --optimizer sgd --lr 0.01 --clip 0 --amp bf16 --steps 300 --quiet --threads 1 --run-dir " + dir.file(name) +
         " " + extra;
}

}  // namespace

TEST(StateRing, RestoresWeightsOptimizerScalerAndRngBitForBit) {
  test::TempDir dir;
  auto model = test::tiny_mlp();
  torch::optim::AdamW optimizer(trainable_tensors(*model), torch::optim::AdamWOptions(1e-2));
  GuardOptions g;
  g.run_dir = dir.file("run");
  g.rollback.enabled = false;  // the ring under test is driven by hand
  StepGuard guard(*model, optimizer, g);
  const at::Tensor x = at::randn({16, 8}), y = at::randint(0, 4, {16});
  for (int64_t s = 0; s < 5; ++s) guard.step(s, x, y);

  StateRing ring(2, size_t(64) << 20);
  LossScalerConfig fp16;
  fp16.enabled = true;
  LossScaler scaler(fp16);
  scaler.update(true);  // a state the default would not have: scale 32768
  ASSERT_TRUE(ring.save(4, *model, optimizer, scaler));
  const NamedTensors saved = snapshot_of(*model, optimizer);
  const at::Tensor draw = at::rand({8});  // the generator moves on from the saved state

  for (int64_t s = 5; s < 10; ++s) guard.step(s, x * 3, y);
  LossScaler later(fp16);
  ASSERT_FALSE(same_bits(saved.front().second, model->named_parameters().front().second));

  const TrainingState* state = ring.newest_before(10);
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(state->step, 4);
  StateRing::restore(*state, *model, optimizer, later);
  const NamedTensors restored = snapshot_of(*model, optimizer);
  ASSERT_EQ(restored.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i)
    EXPECT_TRUE(same_bits(saved[i].second, restored[i].second)) << saved[i].first;
  EXPECT_EQ(later.scale(), 32768.0);
  EXPECT_TRUE(same_bits(at::rand({8}), draw)) << "the CPU generator is back where it was";
  EXPECT_GT(ring.bytes(), size_t(0));
  EXPECT_EQ(ring.newest_before(4), nullptr);
}

TEST(StateRing, KeepsTheNewestStatesWithinItsBudget) {
  test::TempDir dir;
  auto model = test::tiny_mlp();
  torch::optim::AdamW optimizer(trainable_tensors(*model), torch::optim::AdamWOptions(1e-2));
  StateRing ring(3, size_t(64) << 20);
  for (int64_t s = 0; s < 5; ++s) ASSERT_TRUE(ring.save(s, *model, optimizer, LossScaler()));
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(ring.newest_before(100)->step, 4);
  EXPECT_EQ(ring.newest_before(3)->step, 2);
  EXPECT_EQ(ring.newest_before(2), nullptr) << "0 and 1 were dropped";
  ring.forget_from(3);
  EXPECT_EQ(ring.size(), 1u);
  StateRing tiny(3, 100);  // bytes: smaller than one state
  EXPECT_FALSE(tiny.save(0, *model, optimizer, LossScaler()));
  EXPECT_EQ(tiny.size(), 0u);
}

TEST(RollbackPolicy, TroubleTwoStepsRunningCallsForARollbackAndProbationSkipsSpikes) {
  RollbackOptions o;
  o.every = 10;
  RollbackPolicy p(o);
  for (int64_t s = 0; s < 30; ++s) EXPECT_FALSE(p.observe(s, 2.0 - 0.01 * s, false, false));
  EXPECT_TRUE(p.wants_state(29));
  EXPECT_FALSE(p.wants_state(28));
  EXPECT_DOUBLE_EQ(p.spike_threshold(), 20.0) << "10 x the largest healthy loss";
  EXPECT_TRUE(std::isinf(p.skip_loss_above(30))) << "no probation before a rollback";
  EXPECT_TRUE(p.observe(30, std::nan(""), true, false));  // one non-finite step: the stock skip
  EXPECT_FALSE(p.trouble_persists());
  EXPECT_TRUE(p.observe(31, 500.0, false, false));  // and a spike right after it
  EXPECT_TRUE(p.trouble_persists());
  EXPECT_EQ(p.trouble_began(), 30);
  p.rolled_back(31);
  EXPECT_FALSE(p.trouble_persists());
  EXPECT_DOUBLE_EQ(p.skip_loss_above(32), 20.0);
  EXPECT_TRUE(std::isinf(p.skip_loss_above(32 + o.probation_steps)));
  for (int64_t s = 0; s < o.max_probation_skips; ++s) p.observe(32 + s, 900, false, true);
  EXPECT_TRUE(p.trouble_persists()) << "spikes all through probation: the cause persists";
}

TEST(RollbackPolicy, AWarningShortlyBeforeTheTroubleIsWhereItBegan) {
  RollbackPolicy p({});
  for (int64_t s = 0; s < 100; ++s) p.observe(s, 1.0, false, false);
  p.warned(70);
  p.warned(80);  // the same run of warnings
  EXPECT_FALSE(p.wants_state(99)) << "no state is saved while warnings are fresh";
  p.observe(100, std::nan(""), true, false);
  p.observe(101, std::nan(""), true, false);
  EXPECT_EQ(p.trouble_began(), 70);
}

TEST(Rollback, ABurstOfHugeSamplesWrecksTheStockLoopAndRollbackUndoesIt) {
  test::TempDir dir;
  auto fixture = test::run_command(std::string(NANSCOPE_PYTHON) + " " + NANSCOPE_FIXTURES + "/make_scripted_model.py " +
                                   dir.path().string());
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
  auto fixture = test::run_command(std::string(NANSCOPE_PYTHON) + " " + NANSCOPE_FIXTURES + "/make_scripted_model.py " +
                                   dir.path().string());
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  auto r = test::run_command(std::string(NANSCOPE_TRAIN_EXE) + " --model " + dir.file("poisons_its_weights.pt") +
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
