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

}  // namespace

at::Tensor finite_each(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::ones({0}, at::kBool);
  const at::Device device = tensors.front().device();
  std::vector<at::Tensor> present;
  bool all_cuda = true;
  for (const at::Tensor& t : tensors) {
    if (t.numel() > 0) present.push_back(t.detach());
    all_cuda = all_cuda && t.is_cuda();
  }
  at::Tensor finite = at::ones({int64_t(tensors.size())}, at::TensorOptions(device).dtype(at::kBool));
  if (present.empty()) return finite;
  at::Tensor present_finite;
  if (all_cuda) {
    // The largest magnitude of each: a NaN or an infinity anywhere shows in it.
    std::vector<at::Tensor> largest = at::_foreach_norm(present, std::numeric_limits<double>::infinity());
    present_finite = at::isfinite(at::stack(largest));
  } else {
    std::vector<at::Tensor> lows, highs;
    for (const at::Tensor& t : present) {
      auto [lo, hi] = min_max(t);
      lows.push_back(t.device() == device ? lo : lo.to(device));
      highs.push_back(t.device() == device ? hi : hi.to(device));
    }
    present_finite = at::isfinite(at::stack(lows)) & at::isfinite(at::stack(highs));
  }
  if (present.size() == tensors.size()) return present_finite;
  std::vector<int64_t> where;  // the tensors with values, in order
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].numel() > 0) where.push_back(int64_t(i));
  finite.index_put_({at::tensor(where, at::kLong).to(device)}, present_finite);
  return finite;
}

at::Tensor any_nonfinite(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::zeros({1}, at::kFloat);
  return at::logical_not(finite_each(tensors).all()).to(at::kFloat).reshape({1});
}

}  // namespace nanscope::probe
