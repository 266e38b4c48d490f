// The harness's data: batch order, the built-in text, the LR schedule.
#include <gtest/gtest.h>

#include <set>

#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/schedule.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

TEST(BatchSampler, WithoutShuffleBatchIIsRowsIBToIPlus1BWrappingAround) {
  BatchSampler sampler(10, 4, /*shuffle=*/false, 0);
  auto rows = [&](int64_t step) {
    at::Tensor r = sampler.rows(step);
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  EXPECT_EQ(rows(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(rows(2), (std::vector<int64_t>{8, 9, 0, 1}));
  EXPECT_EQ(rows(5), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(BatchSampler, ShuffleIsSeededAndCoversEachEpochOnce) {
  BatchSampler a(12, 4, true, 3), b(12, 4, true, 3), c(12, 4, true, 4);
  std::set<int64_t> epoch;
  bool differs = false;
  for (int64_t step = 0; step < 3; ++step) {
    at::Tensor ra = a.rows(step);
    EXPECT_TRUE(at::equal(ra, b.rows(step)));
    differs |= !at::equal(ra, c.rows(step));
    for (int64_t i = 0; i < 4; ++i) epoch.insert(ra[i].item<int64_t>());
  }
  EXPECT_EQ(epoch.size(), 12u);
  EXPECT_TRUE(differs) << "another seed gives another order";
}

TEST(BuiltinData, TextTargetsAreInputsShiftedByOne) {
  Dataset d = builtin_text_dataset(32);
  ASSERT_GT(d.size(), 100);
  EXPECT_EQ(d.inputs.size(1), 32);
  EXPECT_TRUE(at::equal(d.inputs[3].slice(0, 1), d.targets[3].slice(0, 0, 31)));
}

TEST(Schedule, WarmupIsLinearAndCosineEndsAtZero) {
  EXPECT_DOUBLE_EQ(scheduled_lr(Schedule::constant, 1.0, 4, 100, 0), 0.25);
  EXPECT_DOUBLE_EQ(scheduled_lr(Schedule::constant, 1.0, 4, 100, 3), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(Schedule::constant, 1.0, 4, 100, 50), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(Schedule::cosine, 1.0, 0, 100, 0), 1.0);
  EXPECT_NEAR(scheduled_lr(Schedule::cosine, 1.0, 0, 100, 50), 0.5, 1e-12);
  EXPECT_NEAR(scheduled_lr(Schedule::cosine, 1.0, 10, 110, 110), 0.0, 1e-12);
}
