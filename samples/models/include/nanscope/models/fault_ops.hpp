#pragma once
// The arithmetic of each planted fault, shared by the built-in models. Each
// is the realistic mistake the playbook (P8) names, not a direct
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

// LayerNorm without eps whose variance is E[x^2] - E[x]^2 over unit-variance
// features carrying a +300 offset, each mean held in the autocast type. Under
// bf16 E[x^2] (~9e4 + 1) and E[x]^2 round to the same value (8 mantissa bits
// cannot hold a variance of 1 beside 9e4): the variance cancels to exactly 0
// and the division gives Inf, on any CPU. In fp32 it comes out ~1
// (catastrophic cancellation: a precision-only failure).
at::Tensor layer_norm_by_cancellation(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

// A pre-activation with a large offset and gain ((h + 100) * 1000): ~1e5,
// past fp16's 65504, within bf16's and fp32's range.
at::Tensor blow_up_activation(const at::Tensor& h);

// The attention mask of query 0 also hides key 0, so row 0 is all -inf.
at::Tensor mask_row_zero_completely(const at::Tensor& future_mask);

}  // namespace nanscope::fault_ops
