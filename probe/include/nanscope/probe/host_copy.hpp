#pragma once
// dst.copy_(src) for the guard's own copies (a micro-batch kept for a re-run,
// the buffers a skip puts back, at every clean step; the state kept for a
// rollback, written into the memory of the one it displaces). Two CPU tensors
// of one type and one dense layout are copied byte for byte: through the
// dispatcher and TensorIterator, a copy of a BatchNorm's statistics is all
// fixed cost, and a small step makes five such copies. `dst` is the guard's
// own tensor: no one watches its version counter, which this does not move.
#include <ATen/ATen.h>

namespace nanscope::probe {

void copy_into(const at::Tensor& dst, const at::Tensor& src);

}  // namespace nanscope::probe
