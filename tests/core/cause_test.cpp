// The one rule from evidence to cause (core/cause.hpp): a row per rule, each
// with the evidence that decides it, and the order in which the rules win.
// The guard's remedy (remedy_test.cpp) and nanscope-replay's verdict
// (replay_test.cpp) both come from it.
#include <gtest/gtest.h>

#include "nanscope/core/cause.hpp"

using namespace nanscope;

namespace {

format::Birth birth_at(const std::string& op, format::Phase phase = format::Phase::forward,
                       format::BirthKind kind = format::BirthKind::nan) {
  format::Birth b;
  b.op.op = op;
  b.op.phase = phase;
  b.op.module = "head";
  b.kind = kind;
  return b;
}

// A step that failed at `op` in its one forensic re-run, non-finite at fp32
// too, its rows searched with nothing found.
CauseEvidence failed_at(const std::string& op) {
  CauseEvidence e;
  e.birth = birth_at(op);
  e.repeats = e.reproduced = 1;
  e.fp32 = Fp32Rerun::nonfinite;
  e.rows.state = RowSearch::State::ran;
  return e;
}

struct Row {
  const char* name;
  CauseEvidence evidence;
  CauseRule rule;
  std::optional<format::Verdict> verdict;
  format::Category category;
};

template <class F>
CauseEvidence with(CauseEvidence e, F change) {
  change(e);
  return e;
}

}  // namespace

TEST(Cause, EachRuleDecidesFromItsEvidence) {
  using format::Category;
  using format::Verdict;
  const CauseEvidence log = failed_at("aten::log");
  const std::vector<Row> rows = {
      {"weights held NaN", with(log, [](auto& e) { e.nonfinite_weights = {"fc.weight"}; }),
       CauseRule::nonfinite_weights, Verdict::model_or_data, Category::nonfinite_weights},
      {"compiled only", with(log, [](auto& e) { e.eager_finite = true; }), CauseRule::compiled_program,
       Verdict::compiler, Category::compiled_program},
      {"not reproduced", with(log, [](auto& e) { e.reproduced = 0; }), CauseRule::not_reproduced, Verdict::transient,
       Category::log_nonpositive},
      {"the batch's NaN", with(log, [](auto& e) { e.batch_nonfinite = true; }), CauseRule::nonfinite_batch,
       Verdict::data, Category::nonfinite_input},
      {"an input birth", with(log, [](auto& e) { e.birth = birth_at("input", format::Phase::input); }),
       CauseRule::nonfinite_batch, Verdict::data, Category::nonfinite_input},
      {"another kernel finite",
       with(log,
            [](auto& e) {
              e.kernel_choice = format::KernelChoice{"aten::log", format::Kernel::flash, {format::Kernel::math}};
              e.kernels = format::KernelTrials{
                  "aten::log", format::Kernel::flash, {{format::Kernel::math, format::KernelOutcome::finite}}};
              e.fp32 = Fp32Rerun::finite;  // the kernel's rule comes first: the same precision, another kernel
            }),
       CauseRule::kernel_differs, Verdict::kernel, Category::log_nonpositive},
      {"every kernel non-finite",
       with(log,
            [](auto& e) {
              e.kernel_choice = format::KernelChoice{"aten::log", format::Kernel::flash, {format::Kernel::math}};
              e.kernels = format::KernelTrials{"aten::log",
                                               format::Kernel::flash,
                                               {{format::Kernel::math, format::KernelOutcome::nonfinite},
                                                {format::Kernel::efficient, format::KernelOutcome::unavailable}}};
            }),
       CauseRule::every_row, Verdict::model_or_data, Category::log_nonpositive},
      {"fp32 raised", with(log, [](auto& e) { e.fp32 = Fp32Rerun::raised; }), CauseRule::fp32_rerun_raised,
       std::nullopt, Category::log_nonpositive},
      {"finite in fp32", with(log, [](auto& e) { e.fp32 = Fp32Rerun::finite; }), CauseRule::finite_in_fp32,
       Verdict::precision, Category::log_nonpositive},
      {"a row out of range", with(log, [](auto& e) { e.rows.breaking = e.rows.out_of_range = {5}; }),
       CauseRule::rows_out_of_range, Verdict::data, Category::log_nonpositive},
      {"an ordinary trigger row", with(log, [](auto& e) { e.rows.breaking = {5}; }), CauseRule::trigger_rows,
       Verdict::model_or_data, Category::log_nonpositive},
      {"every row", log, CauseRule::every_row, Verdict::model_or_data, Category::log_nonpositive},
      {"search could not run",
       with(log,
            [](auto& e) {
              e.rows = {RowSearch::State::cannot_run, {}, {}, "one row"};
            }),
       CauseRule::rows_not_searched, Verdict::model_or_data, Category::log_nonpositive},
      {"a rise before an fp32 overflow", with(failed_at("aten::mm"), [](auto& e) { e.grad_norm_rose = true; }),
       CauseRule::every_row, Verdict::model_or_data, Category::grad_explosion},
  };
  for (const Row& row : rows) {
    const Cause c = cause_of(row.evidence);
    EXPECT_EQ(c.rule, row.rule) << row.name;
    EXPECT_EQ(c.verdict, row.verdict) << row.name;
    EXPECT_EQ(c.category, row.category) << row.name;
  }
}

TEST(Cause, ALossOverNoCountedTargetIsTheDatas) {
  CauseEvidence e = failed_at("aten::nll_loss_forward");
  e.birth->counted_targets = 0;
  e.fp32 = Fp32Rerun::not_run;  // no re-run needed: no precision helps a mean over nothing
  const Cause c = cause_of(e);
  EXPECT_EQ(c.category, format::Category::all_targets_ignored);
  EXPECT_EQ(c.rule, CauseRule::no_counted_target);
  EXPECT_EQ(c.verdict, format::Verdict::data);
}

// Re-runs that did not fail again outweigh what the failed step's capture
// named, the batch's own NaN included: nothing that did not recur is a cause.
TEST(Cause, ReRunsThatAllStayedFiniteAreTransientWhateverTheBirth) {
  CauseEvidence e = failed_at("input");
  e.birth->op.phase = format::Phase::input;
  e.repeats = 3;
  e.reproduced = 0;
  EXPECT_EQ(cause_of(e).verdict, format::Verdict::transient);
}

// For every kind of evidence a step can fail with, 0 of N re-runs
// non-finite is transient and only that (the weights' own NaN is read, not
// re-run, so no re-run can contradict it).
TEST(Cause, NoVerdictButTransientWhenNoReRunReproduced) {
  std::vector<CauseEvidence> kinds;
  for (const char* op : {"aten::log", "aten::mm", "aten::exp", "aten::nll_loss_forward", "input"}) {
    CauseEvidence e = failed_at(op);
    if (std::string(op) == "input") e.birth->op.phase = format::Phase::input;
    if (std::string(op) == "aten::nll_loss_forward") e.birth->counted_targets = 0;
    kinds.push_back(e);
  }
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.batch_nonfinite = true; }));
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.fp32 = Fp32Rerun::finite; }));
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.rows.breaking = e.rows.out_of_range = {5}; }));
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.rows.breaking = {5}; }));
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.eager_finite = true; }));
  kinds.push_back(with(failed_at("aten::log"), [](auto& e) { e.birth.reset(); }));
  for (CauseEvidence e : kinds) {
    e.repeats = 3;
    e.reproduced = 0;
    const Cause c = cause_of(e);
    EXPECT_EQ(c.rule, CauseRule::not_reproduced) << (e.birth ? e.birth->op.op : "no birth");
    EXPECT_EQ(c.verdict, format::Verdict::transient) << (e.birth ? e.birth->op.op : "no birth");
  }
}

TEST(Cause, AnOrdinarySampleIsATriggerAndNamedAsOne) {
  CauseEvidence e = failed_at("aten::log");
  e.rows.breaking = {2, 5};
  const Cause c = cause_of(e);
  EXPECT_EQ(c.verdict, format::Verdict::model_or_data);
  EXPECT_EQ(c.rows, (std::vector<int64_t>{2, 5}));
  e.rows.out_of_range = {5};  // one of them far out of the batch's range: that one is the data's fault
  const Cause out = cause_of(e);
  EXPECT_EQ(out.verdict, format::Verdict::data);
  EXPECT_EQ(out.rows, std::vector<int64_t>{5});
}

// The guard gathers lazily: the rules say which re-run they need next.
TEST(Cause, TheRulesAskForTheFp32ReRunThenTheRowSearch) {
  CauseEvidence e;
  e.birth = birth_at("aten::log");
  e.repeats = e.reproduced = 1;
  auto c = classify_cause(e);
  ASSERT_TRUE(std::holds_alternative<EvidenceNeeded>(c));
  EXPECT_EQ(std::get<EvidenceNeeded>(c), EvidenceNeeded::fp32_rerun);
  e.fp32 = Fp32Rerun::nonfinite;
  c = classify_cause(e);
  ASSERT_TRUE(std::holds_alternative<EvidenceNeeded>(c));
  EXPECT_EQ(std::get<EvidenceNeeded>(c), EvidenceNeeded::row_search);
  e.fp32 = Fp32Rerun::finite;  // precision needs no rows
  EXPECT_TRUE(std::holds_alternative<Cause>(classify_cause(e)));
  e.fp32 = Fp32Rerun::not_run;
  e.batch_nonfinite = true;  // nor does the batch's own NaN
  EXPECT_TRUE(std::holds_alternative<Cause>(classify_cause(e)));
  EXPECT_THROW(cause_of(CauseEvidence{}), std::logic_error);
}

// A born op with other kernels here: their re-runs come before the fp32 one.
TEST(Cause, TheRulesAskForTheKernelsReRunsFirstWhereTheOpHasOthers) {
  CauseEvidence e;
  e.birth = birth_at("aten::_scaled_dot_product_flash_attention_for_cpu_backward", format::Phase::backward);
  e.repeats = e.reproduced = 1;
  e.kernel_choice = format::kernel_choice_of(*e.birth, /*cpu=*/true);
  ASSERT_TRUE(e.kernel_choice);
  auto c = classify_cause(e);
  ASSERT_TRUE(std::holds_alternative<EvidenceNeeded>(c));
  EXPECT_EQ(std::get<EvidenceNeeded>(c), EvidenceNeeded::kernel_reruns);
  e.kernels = format::KernelTrials{
      e.kernel_choice->op, format::Kernel::flash, {{format::Kernel::math, format::KernelOutcome::unavailable}}};
  c = classify_cause(e);  // an unavailable kernel says nothing: on to fp32
  ASSERT_TRUE(std::holds_alternative<EvidenceNeeded>(c));
  EXPECT_EQ(std::get<EvidenceNeeded>(c), EvidenceNeeded::fp32_rerun);
  e.batch_nonfinite = true;  // the batch's own NaN needs no kernel
  e.kernels.reset();
  EXPECT_TRUE(std::holds_alternative<Cause>(classify_cause(e)));
}

// A model of its own 16-bit weights has no fp32 re-run in-run: its causes
// after the rows say nothing of precision, and say so.
TEST(Cause, NoFp32ReRunLeavesPrecisionOpen) {
  CauseEvidence e = failed_at("aten::div");
  e.fp32 = Fp32Rerun::unknown;
  const Cause c = cause_of(e);
  EXPECT_EQ(c.rule, CauseRule::every_row);
  EXPECT_TRUE(c.fp32_unknown);
  EXPECT_FALSE(cause_of(failed_at("aten::div")).fp32_unknown);
}
