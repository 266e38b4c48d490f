#pragma once
// The precision a loss's forward ran its matrix products in, read from its
// autograd graph (each node keeps the dtype of the value its forward made).
// Autocast runs them at bf16/fp16; a watched loop that leaves its forward
// outside autocast runs them in fp32 while the guard records and re-runs its
// steps at the guard's 16-bit precision. Read on a guard's first watched
// step only: a walk over the graph, no sync.
#include <ATen/ATen.h>

namespace nanscope {

enum class ProductPrecision {
  none_seen,    // no matrix product or convolution in the graph (nothing to tell)
  float32,      // every one ran in fp32 (or wider)
  sixteen_bit,  // at least one ran in bf16 or fp16
};

ProductPrecision product_precision(const at::Tensor& loss);

}  // namespace nanscope
