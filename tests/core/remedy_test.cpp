// --fallback auto: the remedy fits the cause. The decision on a scripted set
// of re-runs, then whole runs with planted faults against --fallback whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/remedy.hpp"

using namespace nanscope;

namespace {

// Re-runs whose answers the test sets: finite at fp32 or not, finite with
// which module sets in fp32, finite without which row.
class ScriptedReruns : public StepReruns {
 public:
  bool fp32_finite = false;
  std::set<std::string> modules_that_fix;  // any of these in fp32 makes it finite
  std::set<int64_t> rows_that_break;
  std::vector<int64_t> out_of_range;             // rows far out of the batch's range
  bool fp32_raises = false, cut_raises = false;  // the re-run raises instead of running
  int runs = 0;

  bool finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) override {
    ++runs;
    raised_ = (amp == Amp::fp32 && fp32_raises) || (without_row >= 0 && cut_raises);
    if (raised_) return false;
    if (amp == Amp::fp32) return fp32_finite;
    if (without_row >= 0) return rows_that_break.count(without_row) > 0;
    for (const auto& m : fp32_modules)
      if (modules_that_fix.count(m)) return true;
    return false;
  }
  std::vector<std::string> modules_seen() override { return {"embed", "blocks.0", "blocks.0.ln1", "head"}; }
  std::vector<int64_t> rows_out_of_range(const std::vector<int64_t>& rows) override {
    std::vector<int64_t> out;
    for (int64_t r : rows)
      if (std::find(out_of_range.begin(), out_of_range.end(), r) != out_of_range.end()) out.push_back(r);
    return out;
  }
  bool unswitchable() const override { return false; }
  bool raised() const override { return raised_; }
  std::string last_error() const override { return raised_ ? "shape '[3, -1]' is invalid" : ""; }

 private:
  bool raised_ = false;
};

FailedStep failed_with_birth(const std::string& phase, const std::string& op, const std::string& module) {
  FailedStep failed;
  failed.amp = Amp::bf16;
  failed.batch_size = 8;
  failed.capture = format::Capture{};
  format::Birth birth;
  birth.kind = format::BirthKind::inf;
  birth.op.op = op;
  birth.op.phase = format::from_string_or_unknown<format::Phase>(phase);
  birth.op.module = module;
  failed.capture->first_birth = birth;
  return failed;
}

}  // namespace

TEST(Remedy, ANonFiniteBatchIsTheDatasWithoutAReRun) {
  ScriptedReruns reruns;
  FailedStep failed = failed_with_birth("input", "input", "");
  failed.batch_finite = false;
  EXPECT_EQ(choose_remedy(failed, reruns).remedy, Remedy::skip_data);
  EXPECT_EQ(reruns.runs, 0);
}

TEST(Remedy, ABirthInTheInputPhaseIsTheDatas) {
  ScriptedReruns reruns;
  EXPECT_EQ(choose_remedy(failed_with_birth("input", "input", ""), reruns).remedy, Remedy::skip_data);
}

TEST(Remedy, AStepWhoseReRunFindsNoBirthIsTransient) {
  ScriptedReruns reruns;
  FailedStep failed = failed_with_birth("forward", "aten::exp", "head");
  failed.capture->first_birth.reset();
  EXPECT_EQ(choose_remedy(failed, reruns).remedy, Remedy::skip_transient);
}

TEST(Remedy, FiniteAtFp32PutsTheSmallestModuleSetInFp32) {
  ScriptedReruns reruns;
  reruns.fp32_finite = true;
  reruns.modules_that_fix = {"blocks.0.ln1"};
  const RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::div", "blocks.0.ln1"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::fp32_modules);
  EXPECT_EQ(choice.modules, std::vector<std::string>{"blocks.0.ln1"});
  EXPECT_GT(choice.seconds_before, 0);
}

TEST(Remedy, FiniteAtFp32ButWithNoModuleSetIsTheWholeFallback) {
  ScriptedReruns reruns;
  reruns.fp32_finite = true;  // only the whole step in fp32 helps (the loss, say)
  EXPECT_EQ(choose_remedy(failed_with_birth("forward", "aten::div", "head"), reruns).remedy, Remedy::whole_fp32);
}

// An ordinary sample that drives an unsafe op is its trigger, not its
// cause: the op is named, the row too, and no fallback is taken.
TEST(Remedy, NonFiniteAtFp32WithoutAnOrdinarySampleIsAnUnsafeOpItTriggers) {
  ScriptedReruns reruns;
  reruns.rows_that_break = {5};
  const RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::log", "head"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  ASSERT_TRUE(choice.cause);
  EXPECT_EQ(choice.cause->rule, CauseRule::trigger_rows);
  EXPECT_NE(choice.why.find("finite without batch row 5, an ordinary sample"), std::string::npos) << choice.why;
  EXPECT_NE(choice.why.find("aten::log (forward) in module 'head' makes inf"), std::string::npos) << choice.why;
}

TEST(Remedy, NonFiniteAtFp32WithoutASampleOutOfTheBatchsRangeIsTheDatas) {
  ScriptedReruns reruns;
  reruns.rows_that_break = {5};
  reruns.out_of_range = {5};
  const RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::exp", "head"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_data);
  EXPECT_NE(choice.why.find("finite without batch row 5, out of the batch's range"), std::string::npos) << choice.why;
}

// A batch over 64 rows is searched among the rows the birth's op made
// non-finite (one re-run each), not row by row: the trigger is named at the
// cost of a few re-runs, and a search that finds none says so.
TEST(Remedy, ALargeBatchIsSearchedAmongTheRowsItsBirthNames) {
  ScriptedReruns reruns;
  reruns.rows_that_break = {172};
  FailedStep failed = failed_with_birth("forward", "aten::log", "");
  failed.batch_size = 200;
  failed.capture->first_birth->rows = {17, 172};
  RemedyChoice choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_EQ(choice.cause->rule, CauseRule::trigger_rows);
  EXPECT_EQ(choice.cause->rows, std::vector<int64_t>{172});
  EXPECT_EQ(reruns.runs, 3);  // fp32, then without row 17, without row 172

  reruns.rows_that_break.clear();
  choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.cause->rule, CauseRule::rows_not_searched);
  EXPECT_NE(choice.why.find("tried the rows the birth names alone"), std::string::npos) << choice.why;
  failed.capture->first_birth->rows.clear();
  EXPECT_NE(choose_remedy(failed, reruns).why.find("the birth names no row"), std::string::npos);
}

// Non-finite with autocast off: fp32 is shown not to help, so no precision
// remedy is taken, whatever the row search found.
TEST(Remedy, NonFiniteAtFp32WithEverySampleTakesNoPrecisionRemedy) {
  ScriptedReruns reruns;
  RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::log", "head"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_NE(choice.why.find("whichever batch row is left out"), std::string::npos) << choice.why;
  reruns.rows_that_break = {0, 1, 2, 3, 4, 5, 6, 7};  // any row: the batch's size, not a sample
  choice = choose_remedy(failed_with_birth("forward", "aten::log", "head"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_EQ(choice.cause->rule, CauseRule::every_row);
  // At fp32 already the stock fallback changes no precision, only the LR: the
  // model failing on the batch as a whole is evidence enough for that.
  FailedStep at_fp32 = failed_with_birth("forward", "aten::log", "head");
  at_fp32.amp = Amp::fp32;
  EXPECT_EQ(choose_remedy(at_fp32, reruns).remedy, Remedy::whole_fp32);
}

// A batch of one row (a style-transfer image, an RL rollout's remainder):
// the row search cannot run, the line says so, and nothing is escalated.
TEST(Remedy, AOneRowBatchSaysTheSearchCannotRunAndTakesNoFallback) {
  ScriptedReruns reruns;
  FailedStep failed = failed_with_birth("forward", "aten::div", "head");
  failed.batch_size = 1;
  const RemedyChoice choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_NE(choice.why.find("the row search cannot run on a batch of one row"), std::string::npos) << choice.why;
  EXPECT_EQ(reruns.runs, 1);  // the fp32 re-run alone

  reruns.fp32_finite = true;  // precision evidence: then, and only then, fp32
  reruns.modules_that_fix = {"head"};
  EXPECT_EQ(choose_remedy(failed, reruns).remedy, Remedy::fp32_modules);
}

// A model whose own weights are bf16 computes in bf16 with autocast off too:
// that re-run is no fp32 one, so none is asked for and none is claimed, even
// where the scripted "autocast off" re-run would be finite; the rows are still searched.
TEST(Remedy, AModelOfItsOwnBf16WeightsGetsNoFp32ReRunAndNoModuleSet) {
  ScriptedReruns reruns;
  reruns.fp32_finite = true;
  reruns.modules_that_fix = {"head"};
  FailedStep failed = failed_with_birth("forward", "aten::div", "head");
  failed.own_16bit = "bfloat16";
  RemedyChoice choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.remedy, Remedy::whole_fp32);
  EXPECT_EQ(choice.why,
            "non-finite in the model's own bfloat16 weights (no fp32 re-run: widen them to fp32 to try one, or replay "
            "the snapshot); not one batch row's doing");
  EXPECT_EQ(reruns.runs, 8);  // one re-run without each of the 8 rows, none at fp32

  reruns.rows_that_break = {3};
  choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_NE(choice.why.find("finite without batch row 3"), std::string::npos) << choice.why;
}

// A re-run that raised is no evidence: the diagnosis says what raised and
// escalates nothing (a model whose batch rows cannot be cut, an fp32 re-run
// its loss rejects), where counting it as non-finite sent the run to fp32.
TEST(Remedy, ReRunsThatRaisedAreNoEvidenceAndEscalateNothing) {
  ScriptedReruns cut;
  cut.cut_raises = true;  // non-finite at fp32 too, and every batch without a row raises
  RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::div", "rnn"), cut);
  EXPECT_EQ(choice.remedy, Remedy::skip_model_or_data);
  EXPECT_NE(choice.why.find("the row search could not run"), std::string::npos) << choice.why;
  EXPECT_NE(choice.why.find("shape '[3, -1]' is invalid"), std::string::npos) << choice.why;

  ScriptedReruns fp32;
  fp32.fp32_raises = true;
  choice = choose_remedy(failed_with_birth("forward", "aten::div", "rnn"), fp32);
  EXPECT_EQ(choice.remedy, Remedy::skip_undiagnosed);
  EXPECT_NE(choice.why.find("autocast off raised"), std::string::npos) << choice.why;

  ScriptedReruns ran;  // the same step whose re-runs ran: non-finite at fp32, no row: still no fp32
  EXPECT_EQ(choose_remedy(failed_with_birth("forward", "aten::div", "rnn"), ran).remedy, Remedy::skip_model_or_data);
}

namespace {

// Re-runs that are finite only with the kernel `finite_with` switched on
// alone: what a kernel bug looks like to the diagnosis, read off LibTorch's
// own switches as the re-run's ops would read them.
class KernelReruns : public ScriptedReruns {
 public:
  explicit KernelReruns(format::Kernel finite_with) : finite_with_(finite_with) {}
  bool finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) override {
    const compat::KernelSwitches s = compat::kernel_switches();
    ++kernel_runs;
    if (finite_with_ == format::Kernel::native && !s.onednn) return true;
    if (finite_with_ == format::Kernel::math && s.math && !s.flash) return true;
    return ScriptedReruns::finite(amp, fp32_modules, without_row);
  }
  int kernel_runs = 0;

 private:
  format::Kernel finite_with_;
};

}  // namespace

TEST(Remedy, AStepFiniteWithTheOtherKernelOfItsOpPinsThatKernel) {
  if (!compat::onednn_switchable()) GTEST_SKIP() << "this LibTorch was built without oneDNN: nothing to switch";
  KernelReruns reruns(format::Kernel::native);
  reruns.fp32_finite = true;  // finite in fp32 too: the kernel's rule comes first
  const compat::KernelSwitches before = compat::kernel_switches();
  const RemedyChoice choice = choose_remedy(failed_with_birth("forward", "aten::addmm", "head"), reruns);
  EXPECT_EQ(choice.remedy, Remedy::kernel) << choice.why;
  EXPECT_EQ(choice.kernel, format::Kernel::native);
  EXPECT_EQ(choice.why, "aten::addmm: onednn non-finite (the step's), native finite");
  EXPECT_EQ(compat::kernel_switches().onednn, before.onednn) << "the diagnosis puts the switch back";
  // On a GPU the matrix product has one kernel: no kernel is tried, and fp32 decides.
  FailedStep on_gpu = failed_with_birth("forward", "aten::addmm", "head");
  on_gpu.on_cpu = false;
  KernelReruns gpu(format::Kernel::native);
  gpu.fp32_finite = true;
  gpu.modules_that_fix = {"head"};
  EXPECT_EQ(choose_remedy(on_gpu, gpu).remedy, Remedy::fp32_modules);
}

TEST(Remedy, AttentionsKernelsAreTriedWhereThisLibTorchSwitchesThem) {
  KernelReruns reruns(format::Kernel::math);
  const RemedyChoice choice = choose_remedy(
      failed_with_birth("backward", "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attn"), reruns);
  if (!compat::attention_switchable()) {  // LibTorch 1.13: no such kernels to switch
    EXPECT_NE(choice.remedy, Remedy::kernel);
    return;
  }
  EXPECT_EQ(choice.remedy, Remedy::kernel) << choice.why;
  EXPECT_EQ(choice.kernel, format::Kernel::math);
  ASSERT_TRUE(choice.kernel_trials);
  EXPECT_EQ(format::kernel_trials_text(*choice.kernel_trials), "flash non-finite (the step's), math finite");
  // Every kernel non-finite: no kernel's fault, and the rules go on.
  KernelReruns none(format::Kernel::unknown);
  EXPECT_NE(
      choose_remedy(failed_with_birth("backward", "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attn"),
                    none)
          .remedy,
      Remedy::kernel);
}
