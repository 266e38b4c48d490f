#pragma once
// The arithmetic of each planted fault, shared by the built-in models. Each
// is the realistic mistake the playbook (seed 003, P8) names, not a direct
// write of NaN: the NaN/Inf must be born at a real op for the probe to find.
#include <ATen/ATen.h>

namespace nanscope::fault_ops {

// log of a GELU output, which is negative for negative inputs -> NaN.
at::Tensor log_of_activation(const at::Tensor& activation);

// x + sqrt(mean((x*0)^2)): an RMS of an all-zero vector. Finite forward; the
// sqrt's gradient at 0 is Inf, then 0*Inf = NaN further down the backward.
at::Tensor add_rms_of_zeros(const at::Tensor& x);

// LayerNorm written by hand without eps, with the first row of the batch made
// constant (a dead feature row): its variance is 0 and (x-mean)/sqrt(0) = 0/0.
at::Tensor layer_norm_without_eps_on_constant_row(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& bias);

// Cross-entropy through a hand-rolled softmax with no max subtraction over
// offset logits: exp overflows to Inf, then Inf/Inf = NaN.
at::Tensor cross_entropy_by_naive_softmax(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace nanscope::fault_ops
