#include "tensor_stats.hpp"

#include <ATen/EmptyTensor.h>

#include <cmath>
#include <string>
#include <unordered_set>

namespace nanscope::probe {

bool is_floating(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

// A sparse tensor's values are those it stores (nn.Embedding(sparse=True)'s
// gradient), read as they are: isnan of the sparse tensor would build another
// one from it, and the values are where a NaN would be.
at::Tensor stored_values(const at::Tensor& t) { return t.is_sparse() ? t._values() : t; }

bool makes_no_new_values(const char* op_name) {
  static const std::unordered_set<std::string> views{"aten::view",
                                                     "aten::_unsafe_view",
                                                     "aten::view_as",
                                                     "aten::reshape",
                                                     "aten::_reshape_alias",
                                                     "aten::transpose",
                                                     "aten::t",
                                                     "aten::permute",
                                                     "aten::expand",
                                                     "aten::expand_as",
                                                     "aten::select",
                                                     "aten::slice",
                                                     "aten::as_strided",
                                                     "aten::unsqueeze",
                                                     "aten::squeeze",
                                                     "aten::split",
                                                     "aten::split_with_sizes",
                                                     "aten::chunk",
                                                     "aten::unbind",
                                                     "aten::detach",
                                                     "aten::alias",
                                                     "aten::lift_fresh",
                                                     "aten::resolve_conj",
                                                     "aten::resolve_neg",
                                                     "aten::flatten",
                                                     "aten::unflatten",
                                                     "aten::narrow",
                                                     "aten::contiguous",
                                                     "aten::clone",
                                                     "aten::numpy_T",
                                                     "aten::matrix_H",
                                                     "aten::mT"};
  // resize_ / resize_as_ grow a buffer without initialising it, as empty does.
  // A sparse tensor's metadata ops run on one a kernel is still building
  // (coalesce marks its result with _coalesced_ before it holds its values):
  // reading it there reads what is not there yet.
  static const std::unordered_set<std::string> uninitialised{"aten::resize_",        "aten::resize_as_",
                                                             "aten::set_",           "aten::_coalesced_",
                                                             "aten::sparse_resize_", "aten::sparse_resize_and_clear_",
                                                             "aten::_indices",       "aten::_values",
                                                             "aten::indices",        "aten::values"};
  const std::string name = op_name;
  return views.count(name) > 0 || uninitialised.count(name) > 0 || name.find("empty") != std::string::npos;
}

FiniteFlags finite_flags(const at::Tensor& t) {
  if (!is_floating(t) || t.numel() == 0) return {};
  at::Tensor d = stored_values(t).detach();
  at::Tensor flags = at::stack({at::isnan(d).any(), at::isinf(d).any()}).to(at::kCPU);
  const bool* f = flags.data_ptr<bool>();
  return {f[0], f[1]};
}

namespace {

// A tensor kept from an op whose storage was released since (FSDP resizes an
// unsharded parameter's storage to 0 once its module ran): its values are gone.
bool storage_released(const at::Tensor& t) {
  if (!t.has_storage()) return false;
  return t.storage().nbytes() <
         at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size(), size_t(t.storage_offset()));
}

}  // namespace

format::TensorStats tensor_stats(const at::Tensor& tensor) {
  format::TensorStats s;
  s.dtype = c10::toString(tensor.scalar_type());
  s.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  if (!is_floating(tensor) || tensor.numel() == 0 || storage_released(tensor)) return s;
  at::Tensor t = stored_values(tensor).detach().to(at::kFloat);
  at::Tensor finite = at::isfinite(t);
  at::Tensor finite_values = t.masked_select(finite);
  at::Tensor zero = at::zeros({}, t.options());
  const bool any_finite = finite_values.numel() > 0;
  at::Tensor summary = at::stack({at::isnan(t).sum().to(at::kFloat), at::isinf(t).sum().to(at::kFloat),
                                  any_finite ? finite_values.min() : zero, any_finite ? finite_values.max() : zero,
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
