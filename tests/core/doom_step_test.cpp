// The search for a dooming step on a live C++ guard (closure form with a
// closure that takes the batch): the planted fault of
// tests/python/test_doom_search.py in LibTorch. A probe on detached features
// is trained by the rows that carry a count (Poisson NLL); a glitched count at
// step 25 pushes its weights so far that the next counted row, at step 35,
// overflows exp(), and so does every counted row after it unless the run
// goes on without that update.
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <sstream>

#include "../support/test_support.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/nanscope.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

namespace {

constexpr int64_t kFeatures = 8, kClasses = 4, kRows = 8, kPoisoned = 25, kTrigger = 35;

struct ProbedNet : torch::nn::Module {
  ProbedNet() {
    trunk = register_module("trunk", torch::nn::Linear(kFeatures, 16));
    head = register_module("head", torch::nn::Linear(16, kClasses));
    probe = register_module("probe", torch::nn::Linear(16, 1));
  }
  // inputs: kFeatures features, then the row's count and whether it has one.
  at::Tensor loss(const Batch& batch) {
    const at::Tensor x = batch.inputs.slice(1, 0, kFeatures), count = batch.inputs.select(1, kFeatures);
    const at::Tensor counted = batch.inputs.select(1, kFeatures + 1) > 0;
    const at::Tensor h = torch::tanh(trunk->forward(x));
    at::Tensor loss = torch::nn::functional::cross_entropy(head->forward(h), batch.targets);
    if (counted.any().item<bool>()) {
      const at::Tensor log_rate = probe->forward(h.detach()).squeeze(-1);
      loss = loss + torch::nn::functional::poisson_nll_loss(log_rate.index({counted}), count.index({counted}));
    }
    return loss;
  }
  torch::nn::Linear trunk{nullptr}, head{nullptr}, probe{nullptr};
};

Batch batch_at(int64_t step) {
  torch::manual_seed(1000 + step);
  at::Tensor inputs = torch::zeros({kRows, kFeatures + 2});
  inputs.slice(1, 0, kFeatures).copy_(torch::randn({kRows, kFeatures}));
  if (step == kPoisoned) inputs[3][kFeatures] = 1e6, inputs[3][kFeatures + 1] = 1;  // a glitched count: finite
  if (step >= kTrigger) inputs[5][kFeatures] = 3, inputs[5][kFeatures + 1] = 1;     // harmless ones from here on
  return Batch(inputs, torch::randint(0, kClasses, {kRows}));
}

struct GuardedRun {
  std::vector<GuardedStep> steps;
  std::string log;
  std::vector<format::RunEvent> dooms;
};

GuardedRun train(const std::string& dir, bool rollback) {
  torch::manual_seed(0);
  auto net = std::make_shared<ProbedNet>();
  torch::optim::SGD optimizer(net->parameters(), 0.05);
  std::ostringstream log;
  GuardOptions o{dir, Amp::fp32};
  o.log = &log;
  o.warn = false;
  o.rollback.enabled = rollback;
  o.rollback.every = 20;
  o.doom_search.enabled = true;
  GuardedRun run;
  {
    StepGuard guard(*net, optimizer, o);
    const BatchLoss loss = [&](const Batch& b) { return net->loss(b); };
    for (int64_t step = 0; step < kTrigger + 10; ++step)
      run.steps.push_back(guard.closure_step(loss, batch_at(step), StepContext::numbered(step)));
  }
  run.log = log.str();
  for (const format::RunEvent& e : format::read_run(dir + "/run.h5").events)
    if (e.kind == format::EventKind::doom) run.dooms.push_back(e);
  return run;
}

}  // namespace

TEST(DoomStep, AnEarlierUpdateThatDoomedTheStepIsNamedWithItsRowAndTheRunGoesOnWithoutIt) {
  TempDir dir;
  const GuardedRun searched = train(dir.file("searched"), /*rollback=*/false);
  ASSERT_TRUE(searched.steps[kPoisoned].counted()) << "the poisoned update is finite and applied";
  const GuardedStep& failed = searched.steps[kTrigger];
  ASSERT_FALSE(failed.counted()) << searched.log;
  EXPECT_EQ(failed.doomed_by, "step 25, batch row 3") << searched.log;
  EXPECT_EQ(failed.doomed_by_step, kPoisoned);
  EXPECT_EQ(failed.doom_rows, std::vector<int64_t>{3});
  ASSERT_EQ(searched.dooms.size(), 1u) << searched.log;
  EXPECT_EQ(searched.dooms[0].step, kPoisoned) << "the event marks the dooming step";
  EXPECT_NE(searched.dooms[0].text.find("step 25 doomed step 35: without batch row 3 (data set row unknown) the steps "
                                        "up to 35 stay finite; 12 replays from the state after step 19"),
            std::string::npos)
      << searched.dooms[0].text;
  // Rollback off: the probe stays wrecked, and the later counted rows fail too.
  EXPECT_EQ(failed.rolled_back_to, -1);
  EXPECT_FALSE(searched.steps[kTrigger + 1].counted());

  const GuardedRun recovered = train(dir.file("recovered"), /*rollback=*/true);
  EXPECT_GE(recovered.steps[kTrigger].rolled_back_to, 0) << recovered.log;
  EXPECT_NE(recovered.dooms.at(0).text.find("; recovered: replayed without it"), std::string::npos)
      << recovered.dooms[0].text;
  for (int64_t step = kTrigger + 1; step < kTrigger + 10; ++step)
    EXPECT_TRUE(recovered.steps[size_t(step)].counted()) << "step " << step << ": " << recovered.log;
}
