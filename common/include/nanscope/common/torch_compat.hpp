#pragma once
// The one place where LibTorch 1.13 and 2.x differ for nanscope. Everything
// else calls these functions and never checks TORCH_VERSION_* itself.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <c10/util/Exception.h>

#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#define NANSCOPE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace nanscope::compat {

// Whether autocast to `dtype` exists on `device` in this LibTorch
// (1.13's CPU autocast knows bf16 only; 2.x adds fp16 on CPU).
bool autocast_supported(c10::DeviceType device, at::ScalarType dtype);

// The type autocast casts to on `device` right now; nullopt when it is off.
std::optional<at::ScalarType> autocast_dtype(c10::DeviceType device);

// Turns autocast on for `device` with `dtype` for the guard's lifetime, like
// Python's torch.autocast: the cast cache is cleared when the outermost guard
// exits. A disabled guard (enabled=false) switches autocast off inside it,
// which is how an fp32 region is carved out of an autocast forward.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device, at::ScalarType dtype, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

// Autocast switched off on every device that has it while alive: an fp32
// region inside an autocast forward (replay's precision bisection).
struct AutocastOff {
  AutocastGuard cpu{c10::kCPU, at::kBFloat16, false};
  AutocastGuard cuda{c10::kCUDA, at::kHalf, false};
};

// Whether at::_amp_foreach_non_finite_check_and_unscale_ has a kernel for
// `device` (CUDA always; CPU only from LibTorch 2.x).
bool fused_unscale_available(c10::DeviceType device);

// Collects LibTorch's warnings (TORCH_WARN) while alive instead of printing
// them. The handler interface changed between 1.13 and 2.x.
class WarningCollector : public c10::WarningHandler {
 public:
  WarningCollector();
  ~WarningCollector() override;
  WarningCollector(const WarningCollector&) = delete;
  WarningCollector& operator=(const WarningCollector&) = delete;
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning& warning) override;
#else
  void process(const c10::SourceLocation& location, const std::string& msg, bool verbatim) override;
#endif
  const std::vector<std::string>& messages() const { return messages_; }

 private:
  c10::WarningHandler* previous_;
  std::vector<std::string> messages_;
};

// The leaf (a parameter) whose gradient the autograd node the engine is
// evaluating on this thread accumulates: the tensor a hook on that leaf
// (param.register_hook, DistributedDataParallel's reducer) runs for. nullopt
// for any other node, and in 1.13, whose engine does not say which node runs.
std::optional<at::Tensor> leaf_being_accumulated();

// The process-wide switches PyTorch chooses some ops' kernels by, the ones
// torch.backends' flags set: scaled-dot-product attention's backends (2.x;
// 1.13 has no such op, and its fields stay true) and oneDNN.
struct KernelSwitches {
  bool math = true, flash = true, efficient = true, cudnn = true, onednn = true;
};
KernelSwitches kernel_switches();
void set_kernel_switches(const KernelSwitches& switches);
// Whether this LibTorch chooses attention's kernel by those switches (2.x).
bool attention_switchable();
// Whether this LibTorch was built with oneDNN, so that its switch means something.
bool onednn_switchable();

namespace detail {
template <typename StateMap>
const torch::optim::OptimizerParamState* find_state(const StateMap& states, c10::TensorImpl* impl) {
  typename StateMap::const_iterator it;
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;  // what 1.13's c10::guts::to_string(impl) gives
    key << impl;
    it = states.find(key.str());
  } else {
    it = states.find(impl);
  }
  return it == states.end() ? nullptr : it->second.get();
}
template <typename StateMap>
void set_state(StateMap& states, c10::TensorImpl* impl, std::unique_ptr<torch::optim::OptimizerParamState> state) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;
    key << impl;
    states[key.str()] = std::move(state);
  } else {
    states[impl] = std::move(state);
  }
}
}  // namespace detail

// torch::optim keys per-parameter state by the TensorImpl's address: as a
// string in 1.13, as a void* in later 2.x. Returns nullptr when `parameter` has
// no state yet.
inline const torch::optim::OptimizerParamState* find_param_state(const torch::optim::Optimizer& optimizer,
                                                                 const at::Tensor& parameter) {
  return detail::find_state(optimizer.state(), parameter.unsafeGetTensorImpl());
}
inline void set_param_state(torch::optim::Optimizer& optimizer, const at::Tensor& parameter,
                            std::unique_ptr<torch::optim::OptimizerParamState> state) {
  detail::set_state(optimizer.state(), parameter.unsafeGetTensorImpl(), std::move(state));
}

}  // namespace nanscope::compat
