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
    s.grad_norm = step < 20 ? 1.0 + 0.01 * double(step % 3) : 1e6;  // a spike from step 20 on
    for (const Warning& w : sentinel.observe(step, s))
      if (w.signal == "grad_norm_spike") fired.push_back(step);
  }
  ASSERT_FALSE(fired.empty());
  EXPECT_EQ(fired.front(), 20);
  for (size_t i = 1; i < fired.size(); ++i) EXPECT_GE(fired[i] - fired[i - 1], 10);
}

// One layer's tenfold blip on a clean run is noise; trouble persists. A layer
// warns on its second spiking step in a row, measured against the layer as it
// was before the first.
TEST(Sentinel, ALayerWarnsWhenItsSpikeLastsTwoStepsNotForABlip) {
  SentinelOptions options;
  options.warmup = 5;
  options.quiet_steps = 10;
  Sentinel sentinel(options);
  const std::vector<std::string> names{"blocks.1.ln1", "head"};
  std::vector<int64_t> fired;
  for (int64_t step = 0; step < 60; ++step) {
    const double ln = step == 20 ? 0.2 : (step == 40 || step == 41) ? 0.3 : 0.008 * (1 + 0.05 * double(step % 3));
    const std::vector<float> layers{float(ln), 1.0f};
    StepSignals s;
    s.loss = 1;
    s.grad_norm = 1;
    s.layer_names = &names;
    s.layer_grad_norm = &layers;
    for (const Warning& w : sentinel.observe(step, s))
      if (w.signal == "layer_grad_norm") {
        fired.push_back(step);
        EXPECT_EQ(w.where, "blocks.1.ln1");
        EXPECT_LT(w.baseline, 0.01) << "the first spike stayed out of the baseline";
      }
  }
  EXPECT_EQ(fired, (std::vector<int64_t>{41}));
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
