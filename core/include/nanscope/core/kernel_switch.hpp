#pragma once
// A failed step re-run with the born op's other kernels, and the `kernel`
// remedy's pin (format/kernel_trials.hpp says what each kernel is). Both go
// through the process-wide switches torch.backends' flags set, so they reach
// a Python model's ops as a C++ one's; the remedy's pin of an attention
// kernel holds inside the born op's module only (probe::KernelRegions).
#include <functional>
#include <optional>
#include <string>

#include "nanscope/format/kernel_trials.hpp"
#include "nanscope/probe/kernel_pin.hpp"

namespace nanscope {

// The kernels of `birth`'s op that this LibTorch can switch between on the
// step's device (`cpu`): kernel_choice_of's, without attention's in a
// LibTorch that has no such switches, or oneDNN where it was not built; a
// oneDNN op runs natively already when the switch is off. nullopt: none.
std::optional<format::KernelChoice> switchable_kernels(const format::Birth& birth, bool cpu);

// Whether the `kernel` remedy's pin of `kernel` holds inside `module` alone
// (probe::KernelRegions): an attention kernel in a module that opens a scope.
// Otherwise it is process-wide (pin_kernel below).
inline bool pinned_in_module(format::Kernel kernel, const std::string& module) {
  return probe::attention_kernel(kernel) && !module.empty();
}

// `kernel` pinned from now on, process-wide, never undone: a oneDNN pin
// (a convolution's backward runs outside its module), or one whose module
// opens no scope (the root of a C++ model).
void pin_kernel(format::Kernel kernel);

// The step re-run with each of `choice.others` pinned: `finite()` re-runs it
// and says whether it was finite, `raised()` whether that re-run raised
// instead (the kernel refused the step's inputs: `unavailable`).
format::KernelTrials try_kernels(const format::KernelChoice& choice, const std::function<bool()>& finite,
                                 const std::function<bool()>& raised);

}  // namespace nanscope
