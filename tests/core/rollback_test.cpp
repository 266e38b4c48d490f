// Rollback's pieces: a saved state comes back bit for bit and the ring keeps
// the newest within its budget; the policy finds where trouble began.
#include <gtest/gtest.h>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../support/test_support.hpp"
#include "../support/tiny_models.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_guard.hpp"

using namespace nanscope;

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
  for (int64_t s = 0; s < 5; ++s) guard.closure_step(x, y, StepContext::numbered(s));

  StateRing ring(2, size_t(64) << 20);
  LossScalerConfig fp16;
  fp16.enabled = true;
  LossScaler scaler(fp16);
  scaler.update(true);  // a state the default would not have: scale 32768
  ASSERT_TRUE(ring.save(4, *model, optimizer, scaler));
  const NamedTensors saved = snapshot_of(*model, optimizer);
  const at::Tensor draw = at::rand({8});  // the generator moves on from the saved state

  for (int64_t s = 5; s < 10; ++s) guard.closure_step(x * 3, y, StepContext::numbered(s));
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

// Each optimizer LibTorch ships keeps its state as a copy of its tensors (no
// serialization): restored twice, bit for bit both times, so the kept copy is
// not the live state and a restore does not hand it out.
TEST(StateRing, EveryShippedOptimizersStateComesBackBitForBitTwice) {
  using namespace torch::optim;
  auto model = test::tiny_mlp();
  const std::vector<at::Tensor> params = trainable_tensors(*model);
  std::vector<std::pair<std::string, std::unique_ptr<Optimizer>>> optimizers;
  optimizers.emplace_back("adam", std::make_unique<Adam>(params, AdamOptions(1e-2).amsgrad(true)));
  optimizers.emplace_back("adamw", std::make_unique<AdamW>(params, AdamWOptions(1e-2)));
  optimizers.emplace_back("sgd", std::make_unique<SGD>(params, SGDOptions(1e-2).momentum(0.9)));
  optimizers.emplace_back("rmsprop",
                          std::make_unique<RMSprop>(params, RMSpropOptions(1e-2).momentum(0.5).centered(true)));
  optimizers.emplace_back("adagrad", std::make_unique<Adagrad>(params, AdagradOptions(1e-2)));
  const at::Tensor x = at::randn({16, 8}), y = at::randint(0, 4, {16});
  for (auto& [name, optimizer] : optimizers) {
    auto train = [&](int steps) {
      for (int s = 0; s < steps; ++s) {
        optimizer->zero_grad();
        model->loss(x, y).backward();
        optimizer->step();
      }
    };
    train(3);
    StateRing ring(1, size_t(64) << 20);
    ASSERT_TRUE(ring.save(2, *model, *optimizer, LossScaler()));
    std::vector<at::Tensor> saved;
    for (const at::Tensor& t : optimizer_state_tensors(*optimizer)) saved.push_back(t.clone());
    ASSERT_FALSE(saved.empty()) << name;
    EXPECT_GE(ring.bytes(), size_t(saved.front().nbytes())) << name << ": the copy's bytes count toward the budget";
    for (int round = 0; round < 2; ++round) {
      train(2);
      set_lr(*optimizer, 0.5);
      LossScaler scaler;
      StateRing::restore(*ring.oldest(), *model, *optimizer, scaler);
      const std::vector<at::Tensor> now = optimizer_state_tensors(*optimizer);
      ASSERT_EQ(now.size(), saved.size()) << name;
      for (size_t i = 0; i < saved.size(); ++i) EXPECT_TRUE(same_bits(saved[i], now[i])) << name << " round " << round;
      EXPECT_EQ(group_lrs(*optimizer).front(), 1e-2) << name << ": the group's options come back too";
    }
  }
}

// A full ring's new state is written into the memory of the one it displaces
// (no fresh pages to fault in), with the new values; memory something else
// still holds is never written.
TEST(StateRing, ANewStateTakesTheMemoryOfTheOneItDisplaces) {
  auto model = test::tiny_mlp();
  torch::optim::Adam optimizer(trainable_tensors(*model), torch::optim::AdamOptions(1e-2));
  const at::Tensor x = at::randn({16, 8}), y = at::randint(0, 4, {16});
  auto train = [&] {
    optimizer.zero_grad();
    model->loss(x, y).backward();
    optimizer.step();
  };
  train();
  StateRing ring(1, size_t(64) << 20);
  ASSERT_TRUE(ring.save(0, *model, optimizer, LossScaler()));
  std::vector<const void*> memory;
  for (const at::Tensor& t : ring.oldest()->parameters) memory.push_back(t.data_ptr());
  at::Tensor held;  // a tensor someone keeps: its memory is not taken
  std::vector<const void*> optimizer_memory;
  {
    const std::vector<at::Tensor> first = ring.oldest()->optimizer.copy->tensors();
    ASSERT_GT(first.size(), size_t(1));
    held = first.front();
    for (size_t i = 1; i < first.size(); ++i) optimizer_memory.push_back(first[i].data_ptr());
  }
  const at::Tensor held_values = held.clone();

  train();
  ASSERT_TRUE(ring.save(1, *model, optimizer, LossScaler()));
  const TrainingState& second = *ring.oldest();
  EXPECT_EQ(second.step, 1);
  const NamedTensors params = model->named_parameters();
  ASSERT_EQ(second.parameters.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(second.parameters[i].data_ptr(), memory[i]) << params[i].first;
    EXPECT_TRUE(same_bits(second.parameters[i], params[i].second)) << params[i].first;
  }
  const std::vector<at::Tensor> now = optimizer_state_tensors(optimizer);
  const std::vector<at::Tensor> kept = second.optimizer.copy->tensors();
  ASSERT_EQ(kept.size(), now.size());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(same_bits(kept[i], now[i])) << i;
  size_t reused = 0;
  for (const at::Tensor& t : kept) {
    EXPECT_NE(t.data_ptr(), held.data_ptr()) << "memory still held elsewhere was written";
    for (const void* p : optimizer_memory) reused += t.data_ptr() == p;
  }
  EXPECT_EQ(reused, optimizer_memory.size());
  EXPECT_TRUE(same_bits(held, held_values));
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

TEST(RollbackPolicy, TheFirstStepsAreNoBaselineForASpike) {
  // A siamese net's BCE saturates at its second step (0.84, then 50 twice)
  // and then trains well: no trouble, and no fallback for it.
  RollbackPolicy p({});
  EXPECT_FALSE(p.observe(0, 0.84, false, false));
  EXPECT_FALSE(p.observe(1, 50.0, false, false));
  EXPECT_FALSE(p.observe(2, 50.0, false, false));
  EXPECT_FALSE(p.trouble_persists());
  for (int64_t s = 3; s < 9; ++s) EXPECT_FALSE(p.observe(s, 1.0, false, false));
  EXPECT_TRUE(std::isinf(p.spike_threshold())) << "nine healthy steps: still no baseline";
  EXPECT_FALSE(p.observe(9, 2.0, false, false));
  EXPECT_DOUBLE_EQ(p.spike_threshold(), 500.0) << "ten healthy steps: 10 x the largest of them";
  EXPECT_TRUE(p.observe(10, 600.0, false, false));
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
