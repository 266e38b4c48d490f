#pragma once
// Which kernel made the NaN (docs/replay.md, "The kernel"): PyTorch runs some
// ops with one of several kernels it chooses between (scaled-dot-product
// attention's math, flash, memory-efficient and cuDNN backends; oneDNN or
// its own code for a convolution or a matrix product on the CPU). A failed
// step whose first birth is such an op is re-run with each other kernel this
// machine has for it; a NaN that one kernel makes and another does not is the
// kernel's (verdict `kernel`), and its remedy turns the kernel off. Stored in
// a replayed snapshot as /replay@kernel_op and @kernel_trials (format 1.14).
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/capture.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

// math, flash, efficient and cudnn are attention's backends, as
// torch.nn.attention.SDPBackend names them; onednn and native are a CPU
// convolution's or matrix product's kernels with oneDNN on and off.
// One word per line: clang-format folds these lists unstably.
// clang-format off
#define NANSCOPE_KERNELS(X) \
  X(math, "math")           \
  X(flash, "flash")         \
  X(efficient, "efficient") \
  X(cudnn, "cudnn")         \
  X(onednn, "onednn")       \
  X(native, "native")
// clang-format on
NANSCOPE_DECLARE_WORDS(Kernel, NANSCOPE_KERNELS)
// How the step went with a kernel: `unavailable` when the kernel refused
// the step's inputs or device (PyTorch raised), which says nothing.
// clang-format off
#define NANSCOPE_KERNEL_OUTCOMES(X) \
  X(finite, "finite")               \
  X(nonfinite, "non-finite")        \
  X(unavailable, "unavailable")
// clang-format on
NANSCOPE_DECLARE_WORDS(KernelOutcome, NANSCOPE_KERNEL_OUTCOMES)

// The kernels an op is run with: the one the step ran and the others there
// are for it on its device. nullopt for an op PyTorch runs one way.
struct KernelChoice {
  std::string op;  // the op as the birth names it ("aten::_scaled_dot_product_flash_attention_for_cpu")
  // unknown: the birth names the op that chooses, not the kernel it chose
  // (aten::scaled_dot_product_attention), and `others` are all there are.
  Kernel used = Kernel::unknown;
  std::vector<Kernel> others;  // in the order they are tried
};
// From the birth's op (or, in the backward, the forward op that made its
// node); `cpu`: whether the step ran on the CPU, where oneDNN is a choice.
std::optional<KernelChoice> kernel_choice_of(const Birth& birth, bool cpu);

struct KernelTrial {
  Kernel kernel = Kernel::unknown;
  KernelOutcome outcome = KernelOutcome::unavailable;
};

struct KernelTrials {
  std::string op;
  Kernel used = Kernel::unknown;  // non-finite with it: the failed step itself
  std::vector<KernelTrial> tried;
};
// The kernels the step was finite with; none: every kernel tried agrees.
std::vector<Kernel> finite_kernels(const KernelTrials& trials);

// "flash non-finite (the step's), math finite, efficient unavailable"; "the
// step's non-finite, math finite, flash non-finite" where its kernel is unknown.
std::string kernel_trials_text(const KernelTrials& trials);
// The kernel a `kernel` verdict's remedy pins: math where it was finite
// (attention's backend that takes any input), else the first finite one.
Kernel kernel_to_pin(const KernelTrials& trials);
// The code that pins `good` among the trials' kernels, as the user writes
// it: Python's torch.nn.attention.sdpa_kernel or torch.backends flag, or
// LibTorch's at::globalContext() switches for a C++ program.
std::string kernel_pin_code(Kernel good, const KernelTrials& trials, Origin origin);

// /replay@kernel_trials' spelling, "flash=non-finite,math=finite" (the
// step's own first), and back; parse_kernel_trials gives nullopt for an
// empty value.
std::string kernel_trials_value(const KernelTrials& trials);
std::optional<KernelTrials> parse_kernel_trials(const std::string& op, const std::string& value);

}  // namespace nanscope::format
