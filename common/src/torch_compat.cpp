#include "nanscope/common/torch_compat.hpp"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

namespace nanscope::compat {

namespace {

#if NANSCOPE_TORCH_AT_LEAST(2, 4)
bool is_enabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
void set_enabled(c10::DeviceType d, bool on) { at::autocast::set_autocast_enabled(d, on); }
at::ScalarType get_dtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
void set_dtype(c10::DeviceType d, at::ScalarType t) { at::autocast::set_autocast_dtype(d, t); }
#else
// 1.13 has one set of functions per device.
bool is_enabled(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
void set_enabled(c10::DeviceType d, bool on) {
  if (d == c10::kCUDA)
    at::autocast::set_enabled(on);
  else
    at::autocast::set_cpu_enabled(on);
}
at::ScalarType get_dtype(c10::DeviceType d) {
  return d == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void set_dtype(c10::DeviceType d, at::ScalarType t) {
  if (d == c10::kCUDA)
    at::autocast::set_autocast_gpu_dtype(t);
  else
    at::autocast::set_autocast_cpu_dtype(t);
}
#endif

}  // namespace

std::optional<at::ScalarType> autocast_dtype(c10::DeviceType device) {
  if (!is_enabled(device)) return std::nullopt;
  return get_dtype(device);
}

bool autocast_supported(c10::DeviceType device, at::ScalarType dtype) {
  if (device == c10::kCUDA) return dtype == at::kHalf || dtype == at::kBFloat16;
  if (device != c10::kCPU) return false;
#if TORCH_VERSION_MAJOR >= 2
  return dtype == at::kHalf || dtype == at::kBFloat16;
#else
  return dtype == at::kBFloat16;
#endif
}

AutocastGuard::AutocastGuard(c10::DeviceType device, at::ScalarType dtype, bool enabled)
    : device_(device), prev_enabled_(is_enabled(device)), prev_dtype_(get_dtype(device)) {
  set_enabled(device_, enabled);
  if (enabled) set_dtype(device_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Python's autocast clears the cast-weight cache when the outermost region exits;
  // without it, stale low-precision copies of updated weights would be reused.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_enabled(device_, prev_enabled_);
  set_dtype(device_, prev_dtype_);
}

bool fused_unscale_available(c10::DeviceType device) {
  if (device == c10::kCUDA) return true;
#if TORCH_VERSION_MAJOR >= 2
  return device == c10::kCPU;
#else
  return false;
#endif
}

#if TORCH_VERSION_MAJOR >= 2
WarningCollector::WarningCollector() : previous_(c10::WarningUtils::get_warning_handler()) {
  c10::WarningUtils::set_warning_handler(this);
}
WarningCollector::~WarningCollector() { c10::WarningUtils::set_warning_handler(previous_); }
void WarningCollector::process(const c10::Warning& warning) { messages_.push_back(warning.msg()); }
#else
WarningCollector::WarningCollector() : previous_(c10::Warning::get_warning_handler()) {
  c10::Warning::set_warning_handler(this);
}
WarningCollector::~WarningCollector() { c10::Warning::set_warning_handler(previous_); }
void WarningCollector::process(const c10::SourceLocation&, const std::string& msg, bool) { messages_.push_back(msg); }
#endif

std::optional<at::Tensor> leaf_being_accumulated() {
#if TORCH_VERSION_MAJOR >= 2
  const auto node = torch::autograd::get_current_node();  // shared_ptr in 2.6, intrusive_ptr in 2.14
  if (const auto* accumulate = dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get()))
    return accumulate->variable;
#endif
  return std::nullopt;
}

KernelSwitches kernel_switches() {
  at::Context& c = at::globalContext();
  KernelSwitches s;
#if TORCH_VERSION_MAJOR >= 2
  s.math = c.userEnabledMathSDP();
  s.flash = c.userEnabledFlashSDP();
  s.efficient = c.userEnabledMemEfficientSDP();
#if NANSCOPE_TORCH_AT_LEAST(2, 2)
  s.cudnn = c.userEnabledCuDNNSDP();
#endif
#endif
  s.onednn = c.userEnabledMkldnn();
  return s;
}

void set_kernel_switches(const KernelSwitches& s) {
  at::Context& c = at::globalContext();
#if TORCH_VERSION_MAJOR >= 2
  c.setSDPUseMath(s.math);
  c.setSDPUseFlash(s.flash);
  c.setSDPUseMemEfficient(s.efficient);
#if NANSCOPE_TORCH_AT_LEAST(2, 2)
  c.setSDPUseCuDNN(s.cudnn);
#endif
#endif
  c.setUserEnabledMkldnn(s.onednn);
}

bool attention_switchable() { return TORCH_VERSION_MAJOR >= 2; }

bool onednn_switchable() { return at::hasMKLDNN(); }

}  // namespace nanscope::compat
