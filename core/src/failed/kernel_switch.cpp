#include "nanscope/core/kernel_switch.hpp"

namespace nanscope {

std::optional<format::KernelChoice> switchable_kernels(const format::Birth& birth, bool cpu) {
  std::optional<format::KernelChoice> choice = format::kernel_choice_of(birth, cpu);
  if (!choice) return std::nullopt;
  if (choice->used == format::Kernel::unknown || probe::attention_kernel(choice->used)) {
    if (!compat::attention_switchable()) return std::nullopt;
    return choice;
  }
  if (!compat::onednn_switchable()) return std::nullopt;
  // The switch is off already: the op ran natively, and oneDNN is the other.
  if (!compat::kernel_switches().onednn) *choice = {choice->op, format::Kernel::native, {format::Kernel::onednn}};
  return choice;
}

void pin_kernel(format::Kernel kernel) {
  compat::set_kernel_switches(probe::pinned_switches(compat::kernel_switches(), kernel));
}

format::KernelTrials try_kernels(const format::KernelChoice& choice, const std::function<bool()>& finite,
                                 const std::function<bool()>& raised) {
  format::KernelTrials trials{choice.op, choice.used, {}};
  for (format::Kernel kernel : choice.others) {
    const probe::KernelPin pin(kernel);
    const bool was_finite = finite();
    trials.tried.push_back({kernel, raised()     ? format::KernelOutcome::unavailable
                                    : was_finite ? format::KernelOutcome::finite
                                                 : format::KernelOutcome::nonfinite});
  }
  return trials;
}

}  // namespace nanscope
