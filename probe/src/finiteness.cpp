#include "nanscope/probe/finiteness.hpp"

#include <limits>
#include <tuple>

namespace nanscope::probe {

namespace {

// The smallest and largest value; LibTorch 1.13 has no CPU aminmax for fp16.
std::tuple<at::Tensor, at::Tensor> min_max(const at::Tensor& t) {
  if (t.scalar_type() == at::kHalf && t.is_cpu()) return {t.min(), t.max()};
  return at::aminmax(t);
}

// One value per tensor (the largest magnitude) or two (smallest and largest),
// stacked: a NaN or an infinity in a tensor shows in its own. `per_tensor`
// says which. Every tensor given has values.
at::Tensor stacked_extremes(const std::vector<at::Tensor>& present, const at::Device device, int64_t& per_tensor) {
  bool all_cuda = true;
  for (const at::Tensor& t : present) all_cuda = all_cuda && t.is_cuda();
  if (all_cuda) {
    per_tensor = 1;
    return at::stack(at::_foreach_norm(present, std::numeric_limits<double>::infinity()));
  }
  per_tensor = 2;
  std::vector<at::Tensor> extremes;
  extremes.reserve(2 * present.size());
  for (const at::Tensor& t : present) {
    auto [lo, hi] = min_max(t.detach());
    extremes.push_back(t.device() == device ? lo : lo.to(device));
    extremes.push_back(t.device() == device ? hi : hi.to(device));
  }
  return at::stack(extremes);
}

std::vector<at::Tensor> with_values(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> present;
  present.reserve(tensors.size());
  for (const at::Tensor& t : tensors)
    if (t.numel() > 0) present.push_back(t);
  return present;
}

}  // namespace

at::Tensor finite_each(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::ones({0}, at::kBool);
  const at::Device device = tensors.front().device();
  const std::vector<at::Tensor> present = with_values(tensors);
  if (present.empty()) return at::ones({int64_t(tensors.size())}, at::TensorOptions(device).dtype(at::kBool));
  int64_t per_tensor = 1;
  const at::Tensor extremes = stacked_extremes(present, device, per_tensor);
  at::Tensor present_finite = at::isfinite(extremes);
  if (per_tensor > 1) present_finite = present_finite.view({-1, per_tensor}).all(1);
  if (present.size() == tensors.size()) return present_finite;
  std::vector<int64_t> where;  // the tensors with values, in order
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].numel() > 0) where.push_back(int64_t(i));
  at::Tensor finite = at::ones({int64_t(tensors.size())}, at::TensorOptions(device).dtype(at::kBool));
  finite.index_put_({at::tensor(where, at::kLong).to(device)}, present_finite);
  return finite;
}

at::Tensor any_nonfinite(const std::vector<at::Tensor>& tensors) {
  const std::vector<at::Tensor> present = with_values(tensors);
  if (present.empty())
    return at::zeros({1},
                     tensors.empty() ? at::TensorOptions(at::kFloat) : tensors.front().options().dtype(at::kFloat));
  int64_t per_tensor = 1;
  const at::Tensor extremes = stacked_extremes(present, present.front().device(), per_tensor);
  return at::logical_not(at::isfinite(extremes).all()).to(at::kFloat).reshape({1});
}

}  // namespace nanscope::probe
