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

// The poison list's rows leave the epochs that start two steps or more after
// they were listed: each such epoch is a permutation of the other rows, the
// ranks still split it between them, and a list of every row is an error.
TEST(BatchSampler, AnEpochLeavesOutTheRowsListedBeforeItStarts) {
  auto rows_of = [](const BatchSampler& s, int64_t step) {
    at::Tensor r = s.rows(step);
    return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  };
  for (bool shuffle : {false, true}) {
    BatchSampler plain(12, 4, shuffle, 3), leaving(12, 4, shuffle, 3);
    format::PoisonedSample listed;
    listed.row = 5;
    listed.step = 1;  // epoch 0 is steps 0-2; epoch 1 starts at step 3 >= 1 + 2
    leaving.leave_out({listed});
    for (int64_t step = 0; step < 3; ++step) EXPECT_EQ(rows_of(leaving, step), rows_of(plain, step)) << step;
    // Epochs 1 on hold 11 rows: steps 3.. read them 4 at a time, wrapping into the next epoch.
    std::multiset<int64_t> seen;
    for (int64_t step = 3; step < 3 + 11; ++step)
      for (int64_t row : rows_of(leaving, step)) seen.insert(row);
    EXPECT_EQ(seen.count(5), 0u) << "shuffle " << shuffle;
    for (int64_t row = 0; row < 12; ++row) {
      if (row == 5) continue;
      EXPECT_EQ(seen.count(row), 4u) << "each kept row once per epoch, 4 epochs; row " << row;
    }
    EXPECT_EQ(leaving.left_out_at(3), (std::vector<int64_t>{5}));
    EXPECT_TRUE(leaving.left_out_at(0).empty());
  }
  // Two ranks read together what one process with their global batch reads.
  BatchSampler one(12, 4, true, 3), rank0(12, 2, true, 3, 0, 2), rank1(12, 2, true, 3, 1, 2);
  format::PoisonedSample listed;
  listed.row = 7;
  listed.step = 0;
  for (BatchSampler* s : {&one, &rank0, &rank1}) s->leave_out({listed});
  for (int64_t step = 0; step < 8; ++step) {
    std::vector<int64_t> together = rows_of(rank0, step), second = rows_of(rank1, step);
    together.insert(together.end(), second.begin(), second.end());
    EXPECT_EQ(together, rows_of(one, step)) << step;
  }
  // Every row listed: no epoch is left to read.
  BatchSampler all(3, 1, false, 0);
  std::vector<format::PoisonedSample> every;
  for (int64_t row = 0; row < 3; ++row) {
    format::PoisonedSample s;
    s.row = row;
    s.step = format::kListedBeforeTheRun;
    every.push_back(s);
  }
  all.leave_out(every);
  EXPECT_THROW(all.rows(0), std::runtime_error);
}
