// Op-level capture on plain ops and on TorchScript models written by Debian's
// python3-torch: the first NaN and Inf births exactly as docs/design.md defines them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../support/test_support.hpp"

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/models/scripted_model.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"

using namespace nanscope;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// One op that makes a NaN and takes it back out before it returns, as SDPA's
// math path does with the softmax of a fully masked row: a composite op,
// whose inner ops the capture sees nested inside it.
at::Tensor log_of_positives(const at::Tensor& x) { return at::where(x > 0, at::log(x), at::zeros_like(x)); }

at::Tensor call_log_of_positives(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("nanscope_capture_test::log_of_positives", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

}  // namespace

TORCH_LIBRARY(nanscope_capture_test, m) { m.def("log_of_positives(Tensor x) -> Tensor", log_of_positives); }

TEST(Capture, LogOfANegativeIsANanBirthWithItsInputStats) {
  probe::OpCapture capture;
  at::Tensor x = at::tensor({2.0f, -1.0f});
  at::log(x);
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_nan_birth);
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::log");
  EXPECT_EQ(c.first_nan_birth->op.phase, format::Phase::forward);
  ASSERT_EQ(c.first_nan_birth->inputs.size(), 1u);
  EXPECT_DOUBLE_EQ(c.first_nan_birth->inputs[0].min, -1.0);
  EXPECT_EQ(c.first_nan_birth->op.output.nan_count, 1);
  EXPECT_FALSE(c.first_inf_birth);
  EXPECT_EQ(c.first_birth->op.op, "aten::log");
}

TEST(Capture, ANanThatNeverLeavesTheOpThatMadeItIsNoBirth) {
  probe::OpCapture capture;
  at::Tensor x = at::tensor({2.0f, -1.0f});
  at::Tensor y;
  {
    NANSCOPE_MODULE_SCOPE("attn");
    y = call_log_of_positives(x);
  }
  ASSERT_TRUE(y.isfinite().all().item<bool>());
  format::Capture c = capture.result();
  EXPECT_FALSE(c.first_birth) << "the inner aten::log's NaN never left the op: " << c.first_birth->op.op;
  // The birth after it is the run's, found as if the inner NaN had not been.
  {
    NANSCOPE_MODULE_SCOPE("head");
    (void)(y / at::zeros_like(y));
  }
  c = capture.result();
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->op.op, "aten::div");
  EXPECT_EQ(c.first_birth->op.module, "head");
  ASSERT_FALSE(c.trail.empty());
  EXPECT_EQ(c.trail.back().op, "aten::div") << "the trail runs on past the dropped birth, to the real one";
}

TEST(Capture, MaskedFillWithNegInfIsNotABirth) {
  probe::OpCapture capture;
  at::Tensor scores = at::randn({4, 4});
  at::Tensor future = at::ones({4, 4}, at::kBool).triu(1);
  at::softmax(scores.masked_fill(future, -kInf), -1);
  format::Capture c = capture.result();
  EXPECT_FALSE(c.first_birth) << c.first_birth->op.op;
  EXPECT_TRUE(c.reproduced) << "the -inf entries are non-finite values, but no birth";
}

TEST(Capture, SoftmaxOverAFullyMaskedRowIsANanBirth) {
  probe::OpCapture capture;
  at::Tensor scores = at::randn({4, 4});
  at::Tensor mask = at::ones({4, 4}, at::kBool).triu(1);
  mask[0].fill_(true);
  {
    NANSCOPE_MODULE_SCOPE("attn");
    at::softmax(scores.masked_fill(mask, -kInf), -1);
  }
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_nan_birth);
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::softmax") << "the op the code called, not its inner _softmax";
  EXPECT_EQ(c.first_nan_birth->op.module, "attn");
  EXPECT_FALSE(c.first_inf_birth) << "masked_fill's -inf is not an Inf birth";
}

TEST(Capture, ExpOverflowBesideACausalMaskIsAnInfBirth) {
  // A hand-written softmax without max subtraction: the logits hold the mask's
  // -inf (intended) and one logit of 200, which exp overflows to +inf. exp is
  // the birth even though its input held infinities of its own; the NaN that
  // follows (inf / inf) is born later, at div.
  probe::OpCapture capture;
  at::Tensor scores = at::randn({4, 4});
  scores[3][1] = 200.0f;
  at::Tensor future = at::ones({4, 4}, at::kBool).triu(1);
  {
    NANSCOPE_MODULE_SCOPE("attn");
    at::Tensor e = at::exp(scores.masked_fill(future, -kInf));
    (void)(e / e.sum(-1, true));
  }
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_inf_birth);
  EXPECT_EQ(c.first_inf_birth->op.op, "aten::exp");
  EXPECT_EQ(c.first_inf_birth->op.module, "attn");
  EXPECT_EQ(c.first_inf_birth->op.output.inf_count, 1);
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->op.op, "aten::exp") << "the Inf comes before the NaN it causes";
  ASSERT_TRUE(c.first_nan_birth);
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::div");
}

// An Inf born beside a causal mask's intended -inf, which every row holds: the
// rows named are those where the new infinity was born, as a NaN birth's are,
// not none (every row "held" an infinity).
TEST(Capture, AnInfBornBesideAMasksInfinitiesNamesItsRow) {
  probe::OpCapture capture({/*trail_length=*/8, /*batch_size=*/4, /*row_dim=*/0, /*micro_batch=*/-1});
  at::Tensor scores = at::randn({4, 4}) * 0.1;
  scores[1][0] = 10.0f;
  const at::Tensor future = at::ones({4, 4}, at::kBool).triu(1);
  {
    NANSCOPE_MODULE_SCOPE("attn");
    (void)(scores.masked_fill(future, -kInf) * 1e38);  // row 1's logit of 10 passes float's range
  }
  const format::Capture c = capture.result();
  ASSERT_TRUE(c.first_inf_birth);
  EXPECT_EQ(c.first_inf_birth->op.op, "aten::mul");
  EXPECT_EQ(c.first_inf_birth->rows, std::vector<int64_t>{1});
}

TEST(Capture, OpsThatCarryAMasksInfinitiesOnAreNotBirths) {
  // Additive masks, negation, selection and a cast: every infinity in their
  // outputs sits where an input already held one.
  probe::OpCapture capture;
  at::Tensor scores = at::randn({4, 4});
  at::Tensor future = at::ones({4, 4}, at::kBool).triu(1);
  at::Tensor additive = at::zeros({4, 4}).masked_fill(future, -kInf);
  at::Tensor masked = scores + additive;
  at::Tensor flipped = -masked;
  at::Tensor chosen = at::where(future, masked, scores);
  at::Tensor half = chosen.to(at::kBFloat16);
  (void)flipped.sum();  // +inf: carried on by a reduction
  (void)half.sum();     // -inf
  format::Capture c = capture.result();
  EXPECT_FALSE(c.first_inf_birth) << c.first_inf_birth->op.op;
  EXPECT_FALSE(c.first_nan_birth) << c.first_nan_birth->op.op;
}

TEST(Capture, InPlaceOpsAreJudgedOnTheirInputsAsTheyWere) {
  at::Tensor x = at::zeros({3});
  probe::OpCapture capture;
  x.div_(0.0);  // 0/0: NaN born in place
  x.mul_(2.0);  // NaN in, NaN out: no birth
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_nan_birth);
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::div_");
  EXPECT_EQ(c.first_nan_birth->inputs[0].nan_count, 0);
}

TEST(Capture, InfBirthPrecedesTheNanItCauses) {
  probe::OpCapture capture;
  at::Tensor big = at::exp(at::full({2}, 100.0f));  // Inf born
  at::Tensor nan = big - big;                       // inf - inf: NaN born, but inputs not finite -> still a NaN birth
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_inf_birth && c.first_nan_birth);
  EXPECT_EQ(c.first_inf_birth->op.op, "aten::exp");
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::sub");
  EXPECT_EQ(c.first_birth->kind, format::BirthKind::inf);
  EXPECT_LT(c.first_inf_birth->op.index, c.first_nan_birth->op.index);
}

namespace {

// T5's relative position buckets (transformers' _relative_position_bucket):
// log(relative_position / max_exact) is -inf for position 0, and the cast to
// an integer type and where() drop it, as those positions are bucketed
// exactly. An infinity the step makes and throws away.
at::Tensor t5_position_buckets(int64_t positions) {
  const at::Tensor relative = at::arange(positions).abs();
  const at::Tensor is_small = relative < 2;
  at::Tensor large = 2 + (at::log(relative.to(at::kFloat) / 2.0) / std::log(8.0) * 6.0).to(at::kLong);
  large = at::min(large, at::full_like(large, 7));
  return at::where(is_small, relative, large);
}

// A T5-shaped step: the bucketing in the first attention, then `fault` in a
// later module's feed-forward, and the loss. Told what it failed on.
template <typename Fault>
void t5_shaped_step(const Fault& fault, bool say_what_failed) {
  const at::Tensor bias_table = at::randn({8});
  at::Tensor w = at::ones({4, 8}).requires_grad_(true);
  at::Tensor bias;
  {
    NANSCOPE_MODULE_SCOPE("encoder.block.0.layer.0.SelfAttention");
    bias = bias_table.index_select(0, t5_position_buckets(8));
  }
  at::Tensor h;
  {
    NANSCOPE_MODULE_SCOPE("encoder.block.1.layer.1.DenseReluDense.wo");
    h = fault(w);
  }
  at::Tensor loss = (h + bias).sum();
  loss.backward();
  if (say_what_failed) probe::note_step_result({loss.detach(), w.grad()});
}

}  // namespace

TEST(Capture, AnInfinityEveryLaterOpDiscardsIsANoteNotTheBirth) {
  // fp16's overflow, as exp of a large value: the infinity that reaches the loss.
  auto overflow = [](const at::Tensor& w) { return at::exp(w * 100.0); };
  {
    probe::OpCapture capture;
    t5_shaped_step(overflow, /*say_what_failed=*/true);
    format::Capture c = capture.result();
    ASSERT_TRUE(c.first_birth);
    EXPECT_EQ(c.first_birth->op.op, "aten::exp");
    EXPECT_EQ(c.first_birth->op.module, "encoder.block.1.layer.1.DenseReluDense.wo");
    ASSERT_TRUE(c.first_inf_birth);
    EXPECT_EQ(c.first_inf_birth->op.op, "aten::exp") << "the log's -inf is no birth of either kind";
    ASSERT_EQ(c.discarded.size(), 1u);
    EXPECT_NE(c.discarded[0].find("aten::log (forward) in module 'encoder.block.0.layer.0.SelfAttention'"),
              std::string::npos)
        << c.discarded[0];
    EXPECT_NE(format::capture_text(c).find("never reached the loss or a gradient"), std::string::npos)
        << format::capture_text(c);
    ASSERT_FALSE(c.trail.empty());
    EXPECT_EQ(c.trail.back().op, "aten::exp") << "the trail ends at the birth reported";
  }
  {
    // Not told what failed: every birth counts, and the first is the log's.
    probe::OpCapture capture;
    t5_shaped_step(overflow, /*say_what_failed=*/false);
    format::Capture c = capture.result();
    ASSERT_TRUE(c.first_birth);
    EXPECT_EQ(c.first_birth->op.op, "aten::log");
    EXPECT_TRUE(c.discarded.empty());
  }
}

TEST(Capture, ABackwardBirthAfterADiscardedInfinityIsTheBirth) {
  // sqrt at 0: finite forward, an infinite derivative in the backward.
  auto sqrt_at_zero = [](const at::Tensor& w) { return at::sqrt(w - 1.0); };
  probe::OpCapture capture;
  t5_shaped_step(sqrt_at_zero, /*say_what_failed=*/true);
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->op.phase, format::Phase::backward);
  EXPECT_EQ(c.first_birth->op.forward_op, "aten::sqrt");
  EXPECT_EQ(c.first_birth->op.module, "encoder.block.1.layer.1.DenseReluDense.wo");
  ASSERT_EQ(c.discarded.size(), 1u);
  EXPECT_NE(c.discarded[0].find("aten::log"), std::string::npos);
}

TEST(Capture, AMasksIntendedInfinitiesHideNoBirthBesideThem) {
  probe::OpCapture capture;
  const at::Tensor mask = at::ones({4, 4}).tril() == 0;
  const at::Tensor scores = at::full({4, 4}, 50.0f).masked_fill(mask, -kInf);  // the mask's -inf: no birth
  const at::Tensor e = at::exp(scores * 2.0);                                  // overflow beside the mask's -inf
  const at::Tensor loss = e.sum();
  probe::note_step_result({loss});
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->op.op, "aten::exp");
  EXPECT_EQ(c.first_birth->kind, format::BirthKind::inf);
  EXPECT_TRUE(c.discarded.empty());
}

TEST(Capture, SqrtGradientAtZeroIsABackwardBirthLinkedToItsForwardOpAndModule) {
  at::Tensor x = at::zeros({3}).requires_grad_(true);
  probe::OpCapture capture;
  at::Tensor y;
  {
    NANSCOPE_MODULE_SCOPE("blocks.0");
    NANSCOPE_MODULE_SCOPE("scale");
    y = at::sqrt(x * 1.0);
  }
  y.sum().backward();
  format::Capture c = capture.result();
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->kind, format::BirthKind::inf);
  EXPECT_EQ(c.first_birth->op.phase, format::Phase::backward);
  EXPECT_EQ(c.first_birth->op.backward_node, "SqrtBackward0");
  EXPECT_EQ(c.first_birth->op.forward_op, "aten::sqrt");
  EXPECT_EQ(c.first_birth->op.module, "blocks.0.scale");
}

TEST(Capture, FiniteWorkHasNoBirthAndIsNotReproduced) {
  probe::OpCapture capture;
  at::matmul(at::randn({8, 8}), at::randn({8, 8})).relu().sum();
  format::Capture c = capture.result();
  EXPECT_FALSE(c.reproduced);
  EXPECT_FALSE(c.first_birth);
  EXPECT_GT(c.ops_seen, 2);
}

TEST(ModuleScope, NestsAsDottedPathsOnlyWhileCaptureRuns) {
  {
    NANSCOPE_MODULE_SCOPE("blocks.0");
    EXPECT_EQ(probe::current_module_scope(), "") << "scopes cost nothing and record nothing when capture is off";
  }
  probe::OpCapture capture;
  NANSCOPE_MODULE_SCOPE("blocks.0");
  {
    NANSCOPE_MODULE_SCOPE("attn");
    EXPECT_EQ(probe::current_module_scope(), "blocks.0.attn");
  }
  EXPECT_EQ(probe::current_module_scope(), "blocks.0");
}

class ScriptedCapture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                               "/make_probe_models.py " + dir_->path().string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  // One forward + backward of `model` under capture at `amp`.
  static format::Capture capture(const std::string& model, Amp amp) {
    auto m = load_scripted_model(dir_->file(model));
    m->set_training(true);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    at::Tensor inputs = at::normal(0.0, 1.0, {2, 5, 8}, gen);
    at::Tensor targets = at::normal(0.0, 1.0, {2, 5, 1}, gen);
    probe::OpCapture op_capture;
    forward_backward(*m, amp, 1.0, Batch(inputs, targets));
    return op_capture.result();
  }
  static test::TempDir* dir_;
};
test::TempDir* ScriptedCapture::dir_ = nullptr;

TEST_F(ScriptedCapture, IntendedMaskingIsNotReported) {
  format::Capture c = capture("masked_attention.pt", Amp::fp32);
  EXPECT_FALSE(c.first_birth) << c.first_birth->op.op << " in " << c.first_birth->op.module;
}

TEST_F(ScriptedCapture, TheSameMaskedAttentionWithAnOverflowingExpIsReported) {
  // The positive control of the test above: the same weights, mask and
  // masked_fill, with an exp that overflows. Its input holds the mask's -inf,
  // yet the new +inf is its birth; masked_fill is still not one.
  format::Capture c = capture("masked_overflow.pt", Amp::fp32);
  ASSERT_TRUE(c.first_inf_birth);
  EXPECT_EQ(c.first_inf_birth->op.op, "aten::exp");
  EXPECT_EQ(c.first_inf_birth->op.module, "attn");
  EXPECT_EQ(c.first_inf_birth->op.phase, format::Phase::forward);
}

TEST_F(ScriptedCapture, AnOpIsJudgedByItsOwnArgumentsNotTheInterpretersWholeStack) {
  // TorchScript calls ops boxed, and RecordFunction then sees the whole
  // interpreter stack as the op's inputs and outputs: here the residual's x
  // waits below exp's argument. Judged by that stack, exp's new +inf went
  // unseen (its "output" was x) and the NaN at the division came first.
  for (const char* model : {"residual_overflow.pt", "residual_overflow_trace.pt"}) {
    format::Capture c = capture(model, Amp::fp32);
    ASSERT_TRUE(c.first_birth) << model;
    EXPECT_EQ(c.first_birth->op.op, "aten::exp") << model;
    EXPECT_EQ(c.first_birth->kind, format::BirthKind::inf) << model;
    EXPECT_EQ(c.first_birth->op.module, "h.0.attn") << model;
    ASSERT_EQ(c.first_birth->inputs.size(), 1u) << model << ": exp has one argument";
    EXPECT_EQ(c.first_birth->inputs[0].shape, (std::vector<int64_t>{2, 5, 5})) << model;
    EXPECT_GT(c.first_birth->op.output.inf_count, 0) << model;
  }
}

TEST_F(ScriptedCapture, FullyMaskedRowIsANanBirthInTheAttentionModule) {
  format::Capture c = capture("fully_masked.pt", Amp::fp32);
  ASSERT_TRUE(c.first_nan_birth);
  EXPECT_EQ(c.first_nan_birth->op.op, "aten::softmax");
  EXPECT_EQ(c.first_nan_birth->op.module, "attn");
  EXPECT_EQ(c.first_nan_birth->op.phase, format::Phase::forward);
}

TEST_F(ScriptedCapture, Bf16OnlyFailureShowsUnderBf16AndNotInFp32) {
  format::Capture fp32 = capture("bf16_cancellation.pt", Amp::fp32);
  EXPECT_FALSE(fp32.first_birth) << fp32.first_birth->op.op;
  format::Capture bf16 = capture("bf16_cancellation.pt", Amp::bf16);
  ASSERT_TRUE(bf16.first_birth);
  // The cancelled variance is 0 (Inf at the division) or negative (NaN at the
  // sqrt) depending on how bf16 rounds each row; either way it is born in norm.
  const std::string op = bf16.first_birth->op.op;
  EXPECT_TRUE(op == "aten::sqrt" || op == "aten::div") << op;
  EXPECT_EQ(bf16.first_birth->op.module, "norm");
  EXPECT_EQ(bf16.first_birth->op.phase, format::Phase::forward);
}

TEST_F(ScriptedCapture, BackwardOnlyFailureNamesTheNodeAndTheForwardOp) {
  format::Capture c = capture("sqrt_backward.pt", Amp::fp32);
  ASSERT_TRUE(c.first_birth);
  EXPECT_EQ(c.first_birth->op.phase, format::Phase::backward);
  EXPECT_EQ(c.first_birth->op.backward_node, "SqrtBackward0");
  EXPECT_EQ(c.first_birth->op.forward_op, "aten::sqrt");
  EXPECT_EQ(c.first_birth->op.module, "scale");
}

TEST_F(ScriptedCapture, ModulesReachedThroughContainersKeepTheirFullPath) {
  // transformer (ModuleDict) and h (ModuleList) are indexed, never called: the
  // interpreter's frames name only "1" and "attn".
  for (const char* model : {"nested_script.pt", "nested_trace.pt"}) {
    format::Capture c = capture(model, Amp::fp32);
    ASSERT_TRUE(c.first_birth) << model;
    EXPECT_EQ(c.first_birth->op.op, "aten::log") << model;
    EXPECT_EQ(c.first_birth->op.module, "transformer.h.1.attn") << model;
    EXPECT_EQ(c.first_birth->kind, format::BirthKind::nan) << model;
  }
}

TEST_F(ScriptedCapture, FreeFunctionBelongsToTheModuleThatCalledIt) {
  format::Capture root = capture("free_function.pt", Amp::fp32);
  ASSERT_TRUE(root.first_birth);
  EXPECT_EQ(root.first_birth->op.op, "aten::log");
  EXPECT_EQ(root.first_birth->op.module, "") << "a function frame is not a module";
  format::Capture sub = capture("free_function_in_submodule.pt", Amp::fp32);
  ASSERT_TRUE(sub.first_birth);
  EXPECT_EQ(sub.first_birth->op.op, "aten::log");
  EXPECT_EQ(sub.first_birth->op.module, "scorer");
  EXPECT_EQ(sub.first_birth->kind, format::BirthKind::inf);
}
