#pragma once
// Summaries of tensors for capture records. Each call reduces on the tensor's
// device and copies five numbers to the host.
#include <ATen/ATen.h>

#include "nanscope/format/capture.hpp"

namespace nanscope::probe {

bool is_floating(const at::Tensor& t);

// Ops whose outputs hold no value they computed: pure views and copies of
// their input (skipping them saves most of capture's cost), and empty-like
// factories and resize_, whose uninitialised memory may hold any bit pattern (even a view
// of such a buffer, taken before it is filled, does). Casts are not here: a
// cast to fp16 can overflow.
bool makes_no_new_values(const char* op_name);
struct FiniteFlags {
  bool nan = false, inf = false;
};
// Two reductions and one host copy: all that judging a birth needs.
FiniteFlags finite_flags(const at::Tensor& t);
format::TensorStats tensor_stats(const at::Tensor& t);
format::TensorStats scalar_stats(double value);
// Index of the first row (along dim 0) holding a non-finite value, or -1.
int64_t first_nonfinite_row(const at::Tensor& t);

}  // namespace nanscope::probe
