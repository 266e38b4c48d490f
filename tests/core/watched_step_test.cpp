// The watched form in C++: the loop runs forward and backward per
// micro-batch itself; the guard decides at step(), and a failed step is
// re-run through the loss function, naming the micro-batch and its row.
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <utility>

#include "../support/test_support.hpp"
#include "nanscope/core/step_guard_harness.hpp"
#include "nanscope/nanscope.hpp"
#include "nanscope/probe/snapshot.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

namespace {

// A regressor that normalises each sample by its own magnitude: 0 / 0 for an all-zero row.
struct Normalising : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 1))};
  at::Tensor forward(const at::Tensor& x) { return fc(x / x.abs().sum(1, true)); }
};

std::vector<Batch> micro_batches(int count, int bad_micro, int64_t bad_row) {
  std::vector<Batch> out;
  for (int k = 0; k < count; ++k) {
    at::Tensor x = at::randn({5, 4}) + 2, y = at::randn({5, 1});
    if (k == bad_micro) x[bad_row].zero_();
    out.emplace_back(x, y);
  }
  return out;
}

// A quiet guard in bf16 (or `amp`) over a fresh Normalising model, its loss function set.
struct Watched {
  explicit Watched(Amp amp = Amp::bf16, FallbackMode fallback = FallbackMode::automatic, std::ostream* log = nullptr) {
    torch::manual_seed(0);
    GuardOptions options{dir.path(), amp};
    options.log = log;
    options.fallback = fallback;
    guard = std::make_unique<StepGuard>(net, optimizer, options);
    guard->set_loss_fn(loss_of);
  }
  TempDir dir;
  Normalising net;
  torch::optim::SGD optimizer{net.parameters(), 0.1};
  BatchLoss loss_of = [this](const Batch& b) { return torch::mse_loss(net.forward(b.inputs), b.targets); };
  std::unique_ptr<StepGuard> guard;
};

}  // namespace

TEST(WatchedStep, AccumulatedMicroBatchesNameTheBirthsMicroBatchAndRowAndSkipAsATransaction) {
  Watched w;
  StepGuard& guard = *w.guard;
  Normalising& net = w.net;
  const BatchLoss& loss_of = w.loss_of;
  for (int64_t step = 0; step < 4; ++step) {
    const auto micro = micro_batches(3, step == 2 ? 1 : -1, 3);
    const at::Tensor before = net.fc->weight.detach().clone();
    for (const Batch& b : micro) {
      at::Tensor loss;
      {
        auto autocast = guard.autocast();  // the forward and loss only
        loss = loss_of(b) / 3.0;
      }
      guard.backward(loss, b);
    }
    EXPECT_TRUE(StepGuardHarness(guard).step_open());
    const GuardedStep r = guard.step();
    EXPECT_FALSE(StepGuardHarness(guard).step_open());
    if (step != 2) {
      EXPECT_TRUE(r.counted()) << step;
      EXPECT_FALSE(at::equal(before, net.fc->weight));
      continue;
    }
    EXPECT_FALSE(r.counted());
    EXPECT_TRUE(at::equal(before, net.fc->weight));
    EXPECT_EQ(r.first_birth, "nan at aten::div (forward) in module '', micro-batch 1, batch row 3");
    ASSERT_FALSE(r.snapshot.empty());
    const probe::SnapshotContents s = probe::read_snapshot(r.snapshot);
    EXPECT_TRUE(at::equal(s.batch.inputs, micro[1].inputs));  // the birth's micro-batch, as it was
    EXPECT_EQ(s.config.at("micro_batch"), "1");
    EXPECT_EQ(s.config.at("micro_batches"), "3");
  }
  EXPECT_EQ(guard.applied_steps(), 3);
}

// A loop that leaves its forward outside the guard's autocast computes in
// fp32 while the guard says bf16: told once, on the first step. Under the
// guard's autocast, or with the guard at fp32, nothing is said.
TEST(WatchedStep, AForwardOutsideTheGuardsAutocastIsToldOnceAndNothingUnderIt) {
  auto lines_about_autocast = [](Amp amp, bool under_autocast) {
    std::ostringstream log;
    Watched w(amp, FallbackMode::automatic, &log);
    for (int64_t step = 0; step < 3; ++step) {
      for (const Batch& b : micro_batches(2, -1, 0)) {
        std::optional<ScopedAutocast> autocast;
        if (under_autocast) autocast.emplace(w.guard->autocast());
        at::Tensor loss = w.loss_of(b) / 2.0;
        autocast.reset();
        w.guard->backward(loss, b);
      }
      EXPECT_TRUE(w.guard->step().counted());
    }
    std::vector<std::string> told;
    std::istringstream lines(log.str());
    for (std::string line; std::getline(lines, line);)
      if (line.find("outside autocast") != std::string::npos) told.push_back(line);
    return told;
  };
  const std::vector<std::string> outside = lines_about_autocast(Amp::bf16, false);
  ASSERT_EQ(outside.size(), 1u);
  EXPECT_NE(outside[0].find("step 0: the loss's matrix products ran in fp32"), std::string::npos) << outside[0];
  EXPECT_NE(outside[0].find("auto autocast = guard.autocast();"), std::string::npos) << outside[0];
  EXPECT_TRUE(lines_about_autocast(Amp::bf16, true).empty());
  EXPECT_TRUE(lines_about_autocast(Amp::fp32, false).empty());
}

TEST(WatchedStep, WithoutALossFunctionAFailedStepIsSkippedAndSaysItWasNotInvestigated) {
  TempDir dir;
  Normalising net;
  torch::optim::SGD optimizer(net.parameters(), 0.1);
  GuardOptions options{dir.path(), Amp::fp32};
  options.log = nullptr;
  StepGuard guard(net, optimizer, options);
  const Batch b = micro_batches(1, 0, 0).front();
  guard.begin_micro_batch();
  guard.backward(torch::mse_loss(net.forward(b.inputs), b.targets), b);
  const GuardedStep r = guard.step();
  EXPECT_FALSE(r.counted());
  EXPECT_NE(r.first_birth.find("not investigated: no loss function"), std::string::npos) << r.first_birth;
  EXPECT_THROW(guard.step(), std::logic_error);  // no backward since
}

TEST(WatchedStep, TheFallbacksLrCutRidesOnEachUpdateAndTheGroupsKeepTheLoopsLr) {
  Watched w(Amp::bf16, FallbackMode::whole);
  StepGuard& guard = *w.guard;
  torch::optim::SGD& optimizer = w.optimizer;
  const BatchLoss& loss_of = w.loss_of;
  for (int64_t step = 0; step < 3; ++step) {
    optimizer.param_groups()[0].options().set_lr(0.1);  // set by hand each iteration
    const Batch b = micro_batches(1, step == 0 ? 0 : -1, 1).front();
    {
      auto autocast = guard.autocast();  // the forward and loss only
      guard.backward(loss_of(b), b);
    }
    const GuardedStep r = guard.step();
    EXPECT_EQ(r.counted(), step > 0);
    if (step > 0) {
      EXPECT_DOUBLE_EQ(r.lr, 0.05);
    }
    EXPECT_DOUBLE_EQ(optimizer.param_groups()[0].options().get_lr(), 0.1);
  }
  EXPECT_EQ(guard.amp(), Amp::fp32);
}

TEST(WatchedStep, AfterAReRunTheGeneratorIsWhereTheLoopLeftItAndTheMicroBatchAsItWasAtItsBackward) {
  Watched w(Amp::fp32, FallbackMode::off);
  StepGuard& guard = *w.guard;
  // Dropout draws from the CPU generator: the re-run replays those draws.
  guard.set_loss_fn(
      [&](const Batch& b) { return torch::mse_loss(w.net.forward(at::dropout(b.inputs, 0.5, true)), b.targets); });
  const auto micro = micro_batches(2, 1, 3);
  for (const Batch& b : micro) {
    auto autocast = guard.autocast();
    guard.backward(torch::mse_loss(w.net.forward(at::dropout(b.inputs, 0.5, true)), b.targets) / 2.0, b);
  }
  micro[1].inputs.fill_(1.0);  // the loop refills its buffer before step(): finite everywhere now
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor where_the_loop_left_it = generator.get_state();
  const GuardedStep r = guard.step();
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.first_birth, "nan at aten::div (forward) in module '', micro-batch 1, batch row 3");
  EXPECT_TRUE(at::equal(generator.get_state(), where_the_loop_left_it));
}

// A clean step keeps the loop's own micro-batch, no copy, and reads its
// version counters at step(): a write after the backward, first seen at a
// failing step, is said in its birth line (the re-run saw the new values),
// and from then on the guard keeps copies, so the next such step is re-run
// as its batch was at its backward.
TEST(WatchedStep, AWriteIntoTheBatchAfterItsBackwardIsSeenAndLaterStepsKeepACopy) {
  Watched w(Amp::fp32, FallbackMode::off);
  StepGuard& guard = *w.guard;
  std::vector<GuardedStep> results;
  for (int step = 0; step < 3; ++step) {
    const Batch b = micro_batches(1, step > 0 ? 0 : -1, 3).front();
    guard.backward(w.loss_of(b), b);
    if (step > 0) b.inputs.fill_(1.0);  // the loop refills its buffer before step(): finite everywhere now
    results.push_back(guard.step());
  }
  EXPECT_TRUE(results[0].counted());
  EXPECT_FALSE(results[1].counted());
  EXPECT_EQ(results[1].first_birth,
            "not reproduced on re-run, but the loop changed micro-batch 0 in place after its backward, which it had "
            "not done before: the re-run saw the new values (the guard keeps a copy of each micro-batch from now on)");
  EXPECT_FALSE(results[2].counted());
  EXPECT_EQ(results[2].first_birth, "nan at aten::div (forward) in module '', batch row 3");
}

TEST(WatchedStep, AStoppedRunRefusesEveryLaterCallSayingWhereItStopped) {
  TempDir dir;
  Normalising net;
  torch::optim::SGD optimizer(net.parameters(), 0.1);
  GuardOptions options{dir.path(), Amp::fp32};
  options.log = nullptr;
  options.fallback = FallbackMode::off;
  options.rollback.enabled = false;
  options.max_nonfinite_run = 2;
  StepGuard guard(net, optimizer, options);
  auto nan_step = [&] {
    const Batch b(at::full({2, 4}, std::nan("")), at::zeros({2, 1}));
    guard.begin_micro_batch();
    guard.backward(torch::mse_loss(net.forward(b.inputs), b.targets), b);
    return guard.step();
  };
  EXPECT_FALSE(nan_step().counted());
  EXPECT_THROW(nan_step(), DeadRunError);
  EXPECT_TRUE(guard.stopped());
  try {
    guard.begin_micro_batch();
    FAIL() << "a stopped run took another micro-batch";
  } catch (const DeadRunError& e) {
    EXPECT_NE(std::string(e.what()).find("stopped the run at step 1: non-finite on 2 steps in a row"),
              std::string::npos)
        << e.what();
  }
}

// The watched step's order: model calls and losses, unscale() at most once,
// then step(). Each call out of order throws std::logic_error, and leaves the
// guard able to run the next step in order.
TEST(WatchedStep, CallsOutOfOrderThrowAndTheNextStepInOrderStillRuns) {
  Watched w(Amp::fp32);
  StepGuard& guard = *w.guard;
  const Batch b = micro_batches(1, -1, 0).front();
  auto loss = [&] { return w.loss_of(b); };
  auto message_of = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const std::logic_error& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  EXPECT_NE(message_of([&] { guard.unscale(); }).find("no backward"), std::string::npos);
  EXPECT_FALSE(StepGuardHarness(guard).step_open());
  guard.begin_micro_batch();  // a forward, no loss yet
  EXPECT_TRUE(StepGuardHarness(guard).step_open());
  EXPECT_NE(message_of([&] { guard.unscale(); }).find("no backward"), std::string::npos);
  EXPECT_NE(message_of([&] { guard.step(); }).find("no backward"), std::string::npos);
  guard.backward(loss(), b);
  EXPECT_NE(message_of([&] { guard.closure_step(w.loss_of, b); }).find("a watched step is open"), std::string::npos);
  guard.unscale();
  EXPECT_NE(message_of([&] { guard.unscale(); }).find("already called in this step"), std::string::npos)
      << "as GradScaler's unscale_(): a second call would divide twice";
  EXPECT_NE(message_of([&] { guard.backward(loss(), b); }).find("a backward after unscale()"), std::string::npos);
  EXPECT_TRUE(guard.step().counted());
  EXPECT_FALSE(StepGuardHarness(guard).step_open());
  EXPECT_NE(message_of([&] { guard.step(); }).find("no backward"), std::string::npos);
  guard.backward(loss(), b);  // the next step, in order
  EXPECT_TRUE(guard.step().counted());
  EXPECT_EQ(guard.applied_steps(), 2);
}

// unscale() returns the step's grad norm as PyTorch's clip_grad_norm_ takes it
// (the 2-norm of the stacked per-gradient 2-norms), still a tensor, so the
// loop's clip can use it instead of taking it again; it is the norm the step
// then records.
TEST(WatchedStep, UnscaleReturnsTheGradNormTheClipWouldTakeAndTheStepRecords) {
  Watched w;
  StepGuard& guard = *w.guard;
  for (const Batch& b : micro_batches(2, -1, 0)) {
    at::Tensor loss;
    {
      auto autocast = guard.autocast();
      loss = w.loss_of(b) / 2.0;
    }
    guard.backward(loss, b);
  }
  std::vector<at::Tensor> each;
  for (const auto& p : w.net.parameters()) each.push_back(at::linalg_vector_norm(p.grad(), 2));
  const at::Tensor clip_would_take = at::linalg_vector_norm(at::stack(each), 2);

  const at::Tensor norm = guard.unscale();
  ASSERT_EQ(norm.dim(), 0);
  EXPECT_TRUE(at::equal(norm, clip_would_take)) << norm.item<float>() << " against " << clip_would_take.item<float>();
  const GuardedStep r = guard.step();
  ASSERT_TRUE(r.counted());
  EXPECT_EQ(r.outcome.grad_norm, clip_would_take.item<double>());
}

namespace {

// A batch whose first input is this gets the loop's own 0 / 0 of a
// constant added to its loss: NaN, with no gradient.
constexpr float kConstantNan = 99.0f;

// A token classifier's head: dropout, then three classes per sample, the
// mean cross-entropy over the labels not ignored (-100). A micro-batch
// whose every label is -100 has a NaN loss (0 / 0) and exactly zero gradients.
struct Tagger : torch::nn::Module {
  torch::nn::Dropout drop{register_module("drop", torch::nn::Dropout(0.1))};
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 3))};
  at::Tensor loss(const Batch& b) {
    at::Tensor loss = torch::nn::functional::cross_entropy(
        fc(drop(b.inputs)), b.targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    if (b.inputs[0][0].item<float>() == kConstantNan) loss = loss + at::zeros({}) / at::zeros({});
    return loss;
  }
};

// Step STEP's micro-batch K, every label ignored where (step, k) is `empty`.
Batch tagged_micro_batch(int64_t step, int k, const std::vector<std::pair<int64_t, int>>& empty) {
  at::Tensor x = at::randn({6, 4}), y = at::randint(0, 3, {6}, at::kLong);
  if (std::find(empty.begin(), empty.end(), std::make_pair(step, k)) != empty.end()) y.fill_(-100);
  return {x, y};
}

// Trains a fresh Tagger STEPS steps of MICRO micro-batches (loss / MICRO
// each, as the Trainer's accumulation), guarded or plain; the same seeds,
// data and dropout draws either way.
struct TaggerRun {
  TaggerRun(bool guarded, int64_t steps, int micro, const std::vector<std::pair<int64_t, int>>& empty,
            std::pair<int64_t, int> constant_nan_at = {-1, -1}) {
    torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(1e-2));
    std::unique_ptr<StepGuard> guard;
    if (guarded) {
      GuardOptions options{dir.path(), Amp::fp32};
      options.log = nullptr;
      options.fallback = FallbackMode::automatic;
      options.clip = 0;  // the plain loop clips nothing
      guard = std::make_unique<StepGuard>(net, adam, options);
      guard->set_loss_fn([this](const Batch& b) { return net.loss(b); });
    }
    for (int64_t step = 0; step < steps; ++step) {
      adam.zero_grad();
      for (int k = 0; k < micro; ++k) {
        Batch b = tagged_micro_batch(step, k, empty);
        if (std::make_pair(step, k) == constant_nan_at) b.inputs[0][0] = kConstantNan;
        if (!guard) {
          (net.loss(b) / double(micro)).backward();
          continue;
        }
        guard->begin_micro_batch();
        guard->backward(net.loss(b) / double(micro), b);
      }
      if (!guard) {
        adam.step();
        continue;
      }
      results.push_back(guard->step());
    }
    if (guard) {
      applied = guard->applied_steps();
      const std::string file = guard->run_file();
      guard.reset();  // the run file closed, every event in it
      run = format::read_run(file);
    }
  }
  TempDir dir;
  bool seeded = (torch::manual_seed(0), true);  // before the model's weights are drawn
  Tagger net;
  std::vector<GuardedStep> results;
  int64_t applied = 0;
  format::RunData run;
};

}  // namespace

TEST(WatchedStep, AMicroBatchWhoseEveryLabelIsIgnoredAddsNothingAndTheUpdateGoesOnAsThePlainLoops) {
  // Step 1's micro-batch 2 of 4 has no label: its loss is NaN, its gradients
  // exactly zero. The plain loop's update is the other three's; so is the guard's.
  const std::vector<std::pair<int64_t, int>> empty = {{1, 2}};
  TaggerRun guarded(true, 3, 4, empty), plain(false, 3, 4, empty);
  EXPECT_EQ(guarded.applied, 3);
  for (const GuardedStep& r : guarded.results) EXPECT_TRUE(r.counted()) << r.first_birth;

  EXPECT_TRUE(std::isfinite(guarded.results[1].outcome.loss));
  EXPECT_TRUE(at::equal(guarded.net.fc->weight, plain.net.fc->weight)) << "not the plain loop's update, to the bit";
  EXPECT_TRUE(at::equal(guarded.net.fc->bias, plain.net.fc->bias));
  EXPECT_TRUE(test::events_of(guarded.run, format::EventKind::skip).empty());
  EXPECT_TRUE(test::events_of(guarded.run, format::EventKind::snapshot).empty());
  const std::vector<std::string> left_out = test::event_lines(guarded.run, format::EventKind::empty_loss);
  ASSERT_EQ(left_out.size(), size_t(1));
  EXPECT_EQ(left_out[0],
            "1: micro-batch 2 of 4 left out: loss nan, a mean over no target (aten::cross_entropy_loss counted "
            "none), gradients exactly zero; the update went on with the other 3, as a plain loop's");
}

TEST(WatchedStep, OnlyAMeanOverNoTargetIsLeftOutAndAStepWithNoTargetAnywhereIsAFailedStep) {
  // Step 1: every micro-batch without a label, nothing left to learn from: a
  // failed step, as a single batch without one is (skipped, its birth named).
  // Step 2: micro-batch 1's loss is NaN with exactly zero gradients too, but
  // from a division of the loop's own (0 / 0 of a constant), not a mean over
  // no target: no left-out, a failed step naming that division.
  TaggerRun guarded(true, 4, 2, {{1, 0}, {1, 1}}, /*constant_nan_at=*/{2, 1});
  ASSERT_EQ(guarded.results.size(), 4u);
  EXPECT_EQ(guarded.applied, 2);
  EXPECT_FALSE(guarded.results[1].counted());
  EXPECT_EQ(guarded.results[1].first_birth.rfind("nan at aten::cross_entropy_loss (forward)", 0), 0u)
      << guarded.results[1].first_birth;
  EXPECT_FALSE(guarded.results[2].counted());
  EXPECT_EQ(guarded.results[2].first_birth.rfind("nan at aten::div (forward)", 0), 0u)
      << guarded.results[2].first_birth;
  EXPECT_TRUE(test::events_of(guarded.run, format::EventKind::empty_loss).empty());
}
