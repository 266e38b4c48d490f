#include "nanscope/probe/kernel_pin.hpp"

namespace nanscope::probe {

bool attention_kernel(format::Kernel k) {
  return k == format::Kernel::math || k == format::Kernel::flash || k == format::Kernel::efficient ||
         k == format::Kernel::cudnn;
}

compat::KernelSwitches pinned_switches(compat::KernelSwitches s, format::Kernel kernel) {
  if (attention_kernel(kernel)) {
    s.math = kernel == format::Kernel::math;
    s.flash = kernel == format::Kernel::flash;
    s.efficient = kernel == format::Kernel::efficient;
    s.cudnn = kernel == format::Kernel::cudnn;
  } else if (kernel == format::Kernel::onednn || kernel == format::Kernel::native) {
    s.onednn = kernel == format::Kernel::onednn;
  }
  return s;
}

KernelPin::KernelPin(format::Kernel kernel) : before_(compat::kernel_switches()) {
  compat::set_kernel_switches(pinned_switches(before_, kernel));
}

KernelPin::~KernelPin() { compat::set_kernel_switches(before_); }

}  // namespace nanscope::probe
