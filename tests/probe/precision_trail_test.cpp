// The precision trail's comparison (probe/precision_trail.hpp), fed by hand:
// each op's error in ulps of the low type at its own scale, casts of one run
// stepped over, an fp16 backward divided by its loss scale, the memory budget.
// Every value is a short binary fraction, exact in bfloat16 and float32 alike,
// so no expectation depends on how a CPU rounds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "nanscope/probe/precision_trail.hpp"

using namespace nanscope;

namespace {

format::OpRecord op_named(int64_t index, const std::string& op, format::Phase phase = format::Phase::forward,
                          const std::string& module = "norm") {
  format::OpRecord r;
  r.index = index;
  r.op = op;
  r.phase = phase;
  r.module = module;
  return r;
}

at::Tensor values(std::vector<float> v, at::ScalarType type = at::kFloat) {
  return torch::tensor(v, torch::kFloat).to(type);
}

}  // namespace

TEST(PrecisionTrailRecorder, EachOpsErrorIsCountedInUlpsOfTheLowTypeAtItsOwnScale) {
  probe::PrecisionTrailRecorder recorder(at::kBFloat16, 1.0);
  const probe::OpOutputSink low = recorder.low_precision_run();
  low(op_named(0, "aten::mul"), values({1.0f, 2.0f}, at::kBFloat16));
  low(op_named(1, "aten::to"), values({2.0f}, at::kBFloat16));  // a cast fp32 has not
  low(op_named(2, "aten::sub"), values({0.0f}, at::kBFloat16));
  low(op_named(3, "aten::div"), values({INFINITY}, at::kBFloat16));
  const probe::OpOutputSink fp32 = recorder.fp32_run();
  fp32(op_named(0, "aten::mul"), values({1.0f, 2.0f + 1.0f / 128}));  // 1/128 at scale 2: bf16's ulp there is 1/64
  fp32(op_named(1, "aten::sub"), values({1.0f}));                     // 1 at scale 1: 128 ulps of 1/128
  fp32(op_named(2, "aten::div"), values({2.0f}));
  const format::PrecisionTrail t = recorder.result(/*birth_index=*/3);
  EXPECT_EQ(t.type, "bfloat16");
  ASSERT_EQ(t.ops.size(), 3u);
  EXPECT_EQ(t.unmatched, 1);
  EXPECT_DOUBLE_EQ(t.ops[0].max_abs, 1.0 / 128);
  EXPECT_DOUBLE_EQ(t.ops[0].ulps, 0.5);
  EXPECT_NEAR(t.ops[0].max_rel, (1.0 / 128) / (2 + 1.0 / 128), 1e-7);
  EXPECT_EQ(t.ops[1].op.op, "aten::sub");
  EXPECT_DOUBLE_EQ(t.ops[1].ulps, 128);
  EXPECT_EQ(t.ops[2].nonfinite, 1);
  EXPECT_TRUE(std::isinf(t.ops[2].ulps));
  EXPECT_EQ(t.first_lost, 1) << "the subtraction, before the division its result breaks";
  EXPECT_EQ(t.cut_short, "");
  EXPECT_NE(format::precision_lost_text(t).find("aten::sub in module 'norm' (forward): 128 ulps of bfloat16"),
            std::string::npos)
      << format::precision_lost_text(t);
}

TEST(PrecisionTrailRecorder, TheTrailEndsAtTheBirthAndOpsAreMatchedByNameModuleAndShape) {
  probe::PrecisionTrailRecorder recorder(at::kHalf, 1.0);
  const probe::OpOutputSink low = recorder.low_precision_run();
  low(op_named(0, "aten::add", format::Phase::forward, "a"), values({1.0f}, at::kHalf));
  low(op_named(1, "aten::add", format::Phase::forward, "b"), values({1.0f, 1.0f}, at::kHalf));
  low(op_named(2, "aten::exp", format::Phase::forward, "b"), values({INFINITY}, at::kHalf));
  low(op_named(3, "aten::mul", format::Phase::forward, "b"), values({INFINITY}, at::kHalf));
  const probe::OpOutputSink fp32 = recorder.fp32_run();
  fp32(op_named(0, "aten::add", format::Phase::forward, "b"), values({1.0f, 1.0f}));  // b's, not a's
  fp32(op_named(1, "aten::exp", format::Phase::forward, "b"), values({70000.0f}));
  fp32(op_named(2, "aten::mul", format::Phase::forward, "b"), values({70000.0f}));
  const format::PrecisionTrail t = recorder.result(/*birth_index=*/2);
  ASSERT_EQ(t.ops.size(), 2u) << "module a's add has no fp32 counterpart; the mul after the birth is left out";
  EXPECT_EQ(t.unmatched, 1);
  EXPECT_EQ(t.ops[0].op.module, "b");
  EXPECT_EQ(t.ops[0].ulps, 0);
  EXPECT_EQ(t.ops.back().op.op, "aten::exp");
  EXPECT_EQ(t.first_lost, 1) << "exp overflowed float16 itself: the birth is where precision was lost";
  EXPECT_EQ(t.type, "float16");
}

TEST(PrecisionTrailRecorder, AnFp16BackwardIsComparedAtTheLossItsGradientsCameFrom) {
  probe::PrecisionTrailRecorder recorder(at::kHalf, /*loss_scale=*/1024.0);
  const probe::OpOutputSink low = recorder.low_precision_run();
  low(op_named(0, "aten::mul", format::Phase::forward), values({3.0f}, at::kHalf));
  low(op_named(1, "aten::mul", format::Phase::backward), values({3072.0f}, at::kHalf));  // 3 x 1024
  const probe::OpOutputSink fp32 = recorder.fp32_run();
  fp32(op_named(0, "aten::mul", format::Phase::forward), values({3.0f}));
  fp32(op_named(1, "aten::mul", format::Phase::backward), values({3.0f}));
  const format::PrecisionTrail t = recorder.result(-1);
  ASSERT_EQ(t.ops.size(), 2u);
  EXPECT_EQ(t.ops[1].ulps, 0) << "the scaled gradient is the fp32 one times the loss scale";
  EXPECT_EQ(t.first_lost, -1);
  EXPECT_NE(format::precision_lost_text(t).find("no op of the 2 compared"), std::string::npos)
      << format::precision_lost_text(t);
}

TEST(PrecisionTrailRecorder, AStepPastTheMemoryBudgetSaysWhereItsTrailStops) {
  probe::PrecisionTrailRecorder recorder(at::kBFloat16, 1.0, /*budget_bytes=*/64);
  const probe::OpOutputSink low = recorder.low_precision_run();
  low(op_named(0, "aten::mul"), torch::ones({16}, torch::kBFloat16));  // 32 bytes
  low(op_named(1, "aten::mul"), torch::ones({32}, torch::kBFloat16));  // 64 more: past the budget
  low(op_named(2, "aten::log"), values({NAN}, at::kBFloat16));
  const probe::OpOutputSink fp32 = recorder.fp32_run();
  fp32(op_named(0, "aten::mul"), torch::ones({16}));
  fp32(op_named(1, "aten::mul"), torch::ones({32}));
  const format::PrecisionTrail t = recorder.result(/*birth_index=*/2);
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_NE(t.cut_short.find("at op 1"), std::string::npos) << t.cut_short;
}
