#include "tensor_stats.hpp"

#include <cmath>

namespace nanscope::probe {

bool is_floating(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

FiniteFlags finite_flags(const at::Tensor& t) {
  if (!is_floating(t) || t.numel() == 0) return {};
  at::Tensor d = t.detach();
  at::Tensor flags = at::stack({at::isnan(d).any(), at::isinf(d).any()}).to(at::kCPU);
  const bool* f = flags.data_ptr<bool>();
  return {f[0], f[1]};
}

format::TensorStats tensor_stats(const at::Tensor& tensor) {
  format::TensorStats s;
  s.dtype = c10::toString(tensor.scalar_type());
  s.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  if (!is_floating(tensor) || tensor.numel() == 0) return s;
  at::Tensor t = tensor.detach().to(at::kFloat);
  at::Tensor finite = at::isfinite(t);
  at::Tensor finite_values = t.masked_select(finite);
  at::Tensor zero = at::zeros({}, t.options());
  const bool any_finite = finite_values.numel() > 0;
  at::Tensor summary = at::stack({at::isnan(t).sum().to(at::kFloat), at::isinf(t).sum().to(at::kFloat),
                                  any_finite ? finite_values.min() : zero,
                                  any_finite ? finite_values.max() : zero,
                                  any_finite ? finite_values.abs().max() : zero})
                           .to(at::kCPU, at::kDouble);
  const double* v = summary.data_ptr<double>();
  s.nan_count = static_cast<int64_t>(v[0]);
  s.inf_count = static_cast<int64_t>(v[1]);
  s.min = v[2];
  s.max = v[3];
  s.absmax = v[4];
  return s;
}

format::TensorStats scalar_stats(double value) {
  format::TensorStats s;
  s.dtype = "scalar";
  s.nan_count = std::isnan(value) ? 1 : 0;
  s.inf_count = std::isinf(value) ? 1 : 0;
  if (std::isfinite(value)) s.min = s.max = value, s.absmax = std::fabs(value);
  return s;
}

int64_t first_nonfinite_row(const at::Tensor& t) {
  if (!is_floating(t) || t.dim() == 0 || t.numel() == 0) return -1;
  at::Tensor bad_rows = at::logical_not(at::isfinite(t.detach()).reshape({t.size(0), -1}).all(1));
  at::Tensor rows = bad_rows.nonzero();
  return rows.numel() == 0 ? -1 : rows[0][0].item<int64_t>();
}

}  // namespace nanscope::probe
