#pragma once
// Whether tensors hold a NaN or an infinity, without a host read and without
// a mask of each: the checks of the step's batch, the buffers it wrote and
// the training state. A contiguous CPU tensor is read where it lies: one
// vectorized pass over its exponent bits, no kernel (a clean step's checks
// are of small tensors, where a kernel's fixed cost is most of the cost).
// Other CPU tensors give their smallest and largest value in one pass
// (aminmax), about ten times faster than isfinite(t).all() or an
// infinity-norm (LibTorch 1.13, 100,000 floats: 20 us against 240 and 340);
// on a GPU one fused foreach norm covers every tensor.
#include <ATen/ATen.h>

#include <vector>

namespace nanscope::probe {

// A bool tensor [tensors.size()]: true where that tensor is finite throughout
// (an empty tensor is).
at::Tensor finite_each(const std::vector<at::Tensor>& tensors);

// A float tensor [1]: 1 when any of the tensors holds a non-finite value, else 0.
at::Tensor any_nonfinite(const std::vector<at::Tensor>& tensors);

// The largest magnitude in a floating tensor with values, as a 0-dim float
// tensor on its device (NaN when it holds a NaN); nothing the tensor's size
// is allocated (a batch's magnitude, for the headroom warning).
at::Tensor abs_max(const at::Tensor& t);

}  // namespace nanscope::probe
