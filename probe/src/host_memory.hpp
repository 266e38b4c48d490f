#pragma once
// Whether a tensor's values lie in its own memory on the host, where the host
// scans and copies (finiteness.cpp, host_norms.cpp, host_copy.cpp) read and
// write them: a dense CPU tensor of LibTorch's own. A tensor subclass of
// Python's (a DTensor, a wrapper around another tensor), a functorch wrapper
// and a nested tensor keep their values elsewhere, behind the dispatcher;
// their own memory holds nothing to read (a batch of such tensors crashed the
// step's scan), so they go to LibTorch's kernels.
#include <ATen/ATen.h>

namespace nanscope::probe {

// A tensor of LibTorch's own: no Python subclass, functorch wrapper or nested tensor.
inline bool libtorch_own(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return !t.is_nested() && !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::FuncTorchBatched) &&
         !keys.has(c10::DispatchKey::FuncTorchGradWrapper);
}

inline bool in_host_memory(const at::Tensor& t) { return t.is_cpu() && t.layout() == at::kStrided && libtorch_own(t); }

}  // namespace nanscope::probe
