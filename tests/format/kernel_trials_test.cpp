// Which kernels a born op has (format/kernel_trials.hpp), how the trials are
// worded and pinned, and the replay record's copy of them read back.
#include <gtest/gtest.h>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/snapshot_summary.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

Birth birth_at(const std::string& op, Phase phase = Phase::forward, const std::string& forward_op = "") {
  Birth b;
  b.op.op = op;
  b.op.phase = phase;
  b.op.forward_op = forward_op;
  return b;
}

KernelTrials flash_then_math(KernelOutcome math) {
  return {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", Kernel::flash, {{Kernel::math, math}}};
}

}  // namespace

TEST(KernelTrials, AnOpsOtherKernelsFollowFromItsNameAndDevice) {
  const auto cpu_flash = kernel_choice_of(birth_at("aten::_scaled_dot_product_flash_attention_for_cpu"), true);
  ASSERT_TRUE(cpu_flash);
  EXPECT_EQ(cpu_flash->used, Kernel::flash);
  EXPECT_EQ(cpu_flash->others, std::vector<Kernel>{Kernel::math});
  // In the backward, by the op's own name or by the forward op of its node.
  EXPECT_TRUE(
      kernel_choice_of(birth_at("aten::_scaled_dot_product_flash_attention_for_cpu_backward", Phase::backward), true));
  const auto inner = kernel_choice_of(
      birth_at("aten::mul", Phase::backward, "aten::_scaled_dot_product_efficient_attention"), /*cpu=*/false);
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->used, Kernel::efficient);
  EXPECT_EQ(inner->others, (std::vector<Kernel>{Kernel::math, Kernel::flash, Kernel::cudnn}));
  // The op that chooses: its kernel is not known, and every one is tried.
  const auto chooser = kernel_choice_of(birth_at("aten::scaled_dot_product_attention"), true);
  ASSERT_TRUE(chooser);
  EXPECT_EQ(chooser->used, Kernel::unknown);
  EXPECT_EQ(chooser->others, (std::vector<Kernel>{Kernel::math, Kernel::flash}));
  EXPECT_EQ(kernel_trials_text({chooser->op, Kernel::unknown, {{Kernel::math, KernelOutcome::finite}}}),
            "the step's non-finite, math finite");
  // A matrix product has oneDNN and PyTorch's own code on the CPU only.
  const auto mm = kernel_choice_of(birth_at("aten::addmm"), true);
  ASSERT_TRUE(mm);
  EXPECT_EQ(mm->used, Kernel::onednn);
  EXPECT_EQ(mm->others, std::vector<Kernel>{Kernel::native});
  EXPECT_FALSE(kernel_choice_of(birth_at("aten::addmm"), false));
  EXPECT_FALSE(kernel_choice_of(birth_at("aten::log"), true));
  EXPECT_FALSE(kernel_choice_of(birth_at("input", Phase::input), true));
}

TEST(KernelTrials, AreWordedAndPinnedAsTheUserWritesIt) {
  const KernelTrials differ = flash_then_math(KernelOutcome::finite);
  EXPECT_EQ(kernel_trials_text(differ), "flash non-finite (the step's), math finite");
  EXPECT_EQ(finite_kernels(differ), std::vector<Kernel>{Kernel::math});
  EXPECT_EQ(kernel_to_pin(differ), Kernel::math);
  EXPECT_EQ(kernel_to_pin(flash_then_math(KernelOutcome::nonfinite)), Kernel::unknown);
  EXPECT_EQ(kernel_pin_code(Kernel::math, differ, Origin::python),
            "with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH): around the model's forward");
  EXPECT_EQ(kernel_pin_code(Kernel::math, differ, Origin::cpp), "at::globalContext().setSDPUseFlash(false)");
  EXPECT_EQ(kernel_pin_code(Kernel::native, {"aten::addmm", Kernel::onednn, {}}, Origin::nanscope_train),
            "at::globalContext().setUserEnabledMkldnn(false)");
  // Math is pinned where it was finite, whatever came first: it takes any input.
  const KernelTrials cuda{"aten::_scaled_dot_product_efficient_attention",
                          Kernel::efficient,
                          {{Kernel::flash, KernelOutcome::finite}, {Kernel::math, KernelOutcome::finite}}};
  EXPECT_EQ(kernel_to_pin(cuda), Kernel::math);
}

TEST(KernelTrials, TheReplayRecordKeepsThemAndAnOlderOneHasNone) {
  TempDir dir;
  const std::string path = dir.file("step.h5");
  ReplayRecord record;
  record.verdict = Verdict::kernel;
  record.kernel_trials =
      KernelTrials{"aten::_scaled_dot_product_efficient_attention",
                   Kernel::efficient,
                   {{Kernel::math, KernelOutcome::finite}, {Kernel::cudnn, KernelOutcome::unavailable}}};
  {
    Archive archive = Archive::create(path, kSnapshotFileKind);
    write_replay_record(archive.root(), record);
    archive.close();
  }
  {
    Archive archive = Archive::open(path, kSnapshotFileKind, /*writable=*/true);
    const std::optional<ReplayRecord> back = read_replay_record(archive.root());
    ASSERT_TRUE(back && back->kernel_trials);
    EXPECT_EQ(back->verdict, Verdict::kernel);
    EXPECT_EQ(back->kernel_trials->op, "aten::_scaled_dot_product_efficient_attention");
    EXPECT_EQ(kernel_trials_text(*back->kernel_trials),
              "efficient non-finite (the step's), math finite, cudnn unavailable");
    record.kernel_trials.reset();  // a record from before 1.14
    write_replay_record(archive.root(), record);
    archive.close();
  }
  Archive archive = Archive::open(path, kSnapshotFileKind, /*writable=*/false);
  EXPECT_FALSE(read_replay_record(archive.root())->kernel_trials);
  // A word this reader does not know is `unknown`, not an error.
  const std::optional<KernelTrials> foreign = parse_kernel_trials("aten::x", "flash=non-finite,triton=finite");
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->tried.at(0).kernel, Kernel::unknown);
  EXPECT_FALSE(parse_kernel_trials("aten::x", ""));
}
