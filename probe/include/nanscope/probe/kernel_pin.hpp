#pragma once
// One kernel of an op's family chosen through LibTorch's process-wide
// switches (format/kernel_trials.hpp says which kernels there are): what a
// re-run with another kernel needs, and the `kernel` remedy's pin.
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/format/kernel_trials.hpp"

namespace nanscope::probe {

// `switches` with `kernel` the one its family may use: attention's backends
// all off but it; oneDNN on for `onednn`, off for `native`.
compat::KernelSwitches pinned_switches(compat::KernelSwitches switches, format::Kernel kernel);
// Whether `kernel` is one of attention's backends (math, flash, efficient, cudnn).
bool attention_kernel(format::Kernel kernel);

// While alive, `kernel` is pinned; the switches are as they were again after.
class KernelPin {
 public:
  explicit KernelPin(format::Kernel kernel);
  ~KernelPin();
  KernelPin(const KernelPin&) = delete;
  KernelPin& operator=(const KernelPin&) = delete;

 private:
  compat::KernelSwitches before_;
};

}  // namespace nanscope::probe
