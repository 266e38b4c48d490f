// The early warnings' rules on hand-made signals: quiet after firing, a
// layer's spike must last, a loss spike is measured against healthy losses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nanscope/core/sentinel.hpp"

using namespace nanscope;

TEST(Sentinel, ASignalThatFiredStaysQuietForAWhile) {
  SentinelOptions options;
  options.warmup = 5;
  options.quiet_steps = 10;
  Sentinel sentinel(options);
  std::vector<int64_t> fired;
  for (int64_t step = 0; step < 40; ++step) {
    StepSignals s;
    s.loss = 1;
    s.grad_norm = step < 20 ? 1.0 + 0.01 * double(step % 3) : 100.0;  // a spike from step 20 on (not a jump)
    for (const Warning& w : sentinel.observe(step, s))
      if (w.signal == "grad_norm_spike") fired.push_back(step);
  }
  ASSERT_FALSE(fired.empty());
  EXPECT_EQ(fired.front(), 21) << "a spike must last: the first spiking step is held out";
  for (size_t i = 1; i < fired.size(); ++i) EXPECT_GE(fired[i] - fired[i - 1], 10);
}

// One layer's tenfold blip on a clean run is noise; trouble persists, and a
// layer that goes wrong becomes most of the step's gradient. A layer warns on
// its second spiking step in a row, measured against the layer as it was
// before the first, and only while it carries half the global norm or more:
// a LayerNorm gain at 1% of the norm that jumps 17x for two batches (the
// false warning of a clean GPT) stays quiet.
TEST(Sentinel, ALayerWarnsWhenItsSpikeLastsAndCarriesTheStep) {
  SentinelOptions options;
  options.warmup = 5;
  options.quiet_steps = 10;
  Sentinel sentinel(options);
  const std::vector<std::string> names{"blocks.1.ln1", "head"};
  std::vector<int64_t> fired;
  for (int64_t step = 0; step < 80; ++step) {
    const double noise = 0.008 * (1 + 0.05 * double(step % 3));
    const double ln = step == 20                   ? 5.0    // a one-step blip, however large
                      : (step == 40 || step == 41) ? 0.137  // 17x for two steps, a sixth of the norm
                      : (step == 60 || step == 61) ? 5.0    // two steps, and most of the norm
                                                   : noise;
    const std::vector<float> layers{float(ln), 1.0f};
    StepSignals s;
    s.loss = 1;
    s.grad_norm = std::sqrt(ln * ln + 1.0);
    s.layer_names = &names;
    s.layer_grad_norm = &layers;
    for (const Warning& w : sentinel.observe(step, s))
      if (w.signal == "layer_grad_norm") {
        fired.push_back(step);
        EXPECT_EQ(w.where, "blocks.1.ln1");
        EXPECT_LT(w.baseline, 0.01) << "the first spike stayed out of the baseline";
      }
  }
  EXPECT_EQ(fired, (std::vector<int64_t>{61}));
}

// word_language_model with clipping off: 7.8, then 6.7e11 (finite, applied),
// then NaN. A thousandfold jump warns at once, with no warm-up, and is not
// also reported as a spike; a second jump is measured against healthy steps.
TEST(Sentinel, AThousandfoldJumpOfLossOrGradNormWarnsWithoutWarmup) {
  Sentinel sentinel;  // the defaults: 20 steps of warm-up for the other signals
  const std::vector<double> losses{7.8, 7.1, 6.7e11, 6.9, 5e10};
  const std::vector<double> norms{2.0, 1.5, 3e9, 1.8, 2.1};
  std::vector<std::string> fired;
  for (size_t step = 0; step < losses.size(); ++step) {
    StepSignals s;
    s.loss = losses[step];
    s.grad_norm = norms[step];
    for (const Warning& w : sentinel.observe(int64_t(step), s)) {
      fired.push_back(std::to_string(step) + " " + w.signal);
      if (w.signal == "loss_jump") {
        EXPECT_EQ(w.baseline, 7.8) << w.text;
      }
    }
  }
  EXPECT_EQ(fired, (std::vector<std::string>{"2 loss_jump", "2 grad_norm_jump"}))
      << "the second loss jump (step 4) falls in the quiet steps after the first";
}

TEST(Sentinel, ASlowRiseIsNoJump) {
  Sentinel sentinel;
  int warnings = 0;
  for (int64_t step = 0; step < 400; ++step) {  // x1.02 a step: 2750x over the run, never 1000x in one step
    StepSignals s;
    s.loss = std::pow(1.02, double(step));
    s.grad_norm = 1;
    for (const Warning& w : sentinel.observe(step, s)) warnings += w.signal == "loss_jump";
  }
  EXPECT_EQ(warnings, 0);
}

// A loss spike does not raise the bar for the next one: a second burst, after
// the first was skipped or rolled back, is still 10x the healthy losses.
TEST(Sentinel, ALossSpikeIsMeasuredAgainstHealthyLossesOnly) {
  SentinelOptions options;
  options.warmup = 5;
  options.quiet_steps = 10;
  Sentinel sentinel(options);
  std::vector<int64_t> fired;
  for (int64_t step = 0; step < 60; ++step) {
    StepSignals s;
    s.loss = (step == 20 || step == 45) ? 100.0 : 1.0;
    s.grad_norm = 1;
    for (const Warning& w : sentinel.observe(step, s))
      if (w.signal == "loss_spike") fired.push_back(step);
  }
  EXPECT_EQ(fired, (std::vector<int64_t>{20, 45}));
}

// A resumed run warns against the run it continues: a sentinel restored from
// another's state fires exactly as the original does on the steps after it,
// where a fresh one would still be warming up.
TEST(Sentinel, ARestoredSentinelWarnsAsTheOneItContinues) {
  const std::vector<std::string> names{"blocks.0.ln1", "head"};
  auto signals = [&](int64_t step, std::vector<float>& layers) {
    const double burst = step >= 70 && step < 73 ? 50.0 : 1.0;  // two steps and more: a spike that lasts
    layers = {float(0.01 * (1 + 0.05 * double(step % 3))), float(burst * (1 + 0.03 * double(step % 5)))};
    StepSignals s;
    s.loss = 2.0 - 0.001 * double(step);
    s.grad_norm = std::sqrt(double(layers[0]) * layers[0] + double(layers[1]) * layers[1]);
    s.layer_names = &names;
    s.input_absmax = 1.0 + 0.01 * double(step);
    return s;
  };
  Sentinel original;
  std::vector<float> layers;
  for (int64_t step = 0; step < 60; ++step) {
    StepSignals s = signals(step, layers);
    s.layer_grad_norm = &layers;
    original.observe(step, s);
  }
  Sentinel resumed, fresh;
  resumed.restore(original.state());
  EXPECT_EQ(resumed.state(), original.state());
  std::vector<std::string> from_original, from_resumed, from_fresh;
  for (int64_t step = 60; step < 100; ++step) {
    StepSignals s = signals(step, layers);
    s.layer_grad_norm = &layers;
    for (const Warning& w : original.observe(step, s)) from_original.push_back(std::to_string(step) + " " + w.text);
    for (const Warning& w : resumed.observe(step, s)) from_resumed.push_back(std::to_string(step) + " " + w.text);
    for (const Warning& w : fresh.observe(step, s)) from_fresh.push_back(std::to_string(step) + " " + w.text);
  }
  ASSERT_FALSE(from_original.empty()) << "the burst at step 70 must warn";
  EXPECT_EQ(from_resumed, from_original);
  EXPECT_NE(from_fresh, from_original) << "a fresh sentinel is still warming up at step 70";
}
