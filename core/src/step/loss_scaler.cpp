#include "nanscope/core/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "nanscope/common/torch_compat.hpp"

namespace nanscope {

LossScaler::LossScaler(LossScalerConfig config) : config_(config), scale_(config.init_scale) {}

at::Tensor LossScaler::scale_loss(const at::Tensor& loss) const { return config_.enabled ? loss * scale_ : loss; }

at::Tensor LossScaler::unscale_(const std::vector<at::Tensor>& given) const {
  // A sparse gradient is unscaled and checked through its values, as
  // torch.amp.GradScaler does (a duplicate index's values sum on coalescing,
  // which the step's norm then sees).
  std::vector<at::Tensor> values;  // filled only when there is a sparse one: a clean step copies nothing
  if (std::any_of(given.begin(), given.end(), [](const at::Tensor& g) { return g.is_sparse(); })) {
    values.reserve(given.size());
    for (const at::Tensor& g : given) values.push_back(g.is_sparse() ? g._values() : g);
  }
  const std::vector<at::Tensor>& grads = values.empty() ? given : values;
  const auto device = grads.empty() ? at::Device(at::kCPU) : grads.front().device();
  at::Tensor found_inf = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (grads.empty()) return found_inf;
  const double inv_scale = 1.0 / scale();
  if (compat::fused_unscale_available(device.type())) {
    at::Tensor inv = at::full({1}, inv_scale, at::TensorOptions().dtype(at::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv);
    return found_inf;
  }
  // Plain path (CPU on LibTorch 1.13): same contract, a handful of ops per grad.
  if (inv_scale != 1.0) at::_foreach_mul_(grads, inv_scale);
  std::vector<at::Tensor> all_finite;
  all_finite.reserve(grads.size());
  for (const auto& g : grads) all_finite.push_back(at::isfinite(g).all());
  return at::logical_not(at::stack(all_finite).all()).to(at::kFloat).reshape({1});
}

const at::Tensor& LossScaler::none_found(const at::Device& device) {
  if (!none_found_.defined() || none_found_.device() != device)
    none_found_ = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  return none_found_;
}

void LossScaler::update(bool found_inf) {
  if (!config_.enabled) return;
  if (found_inf) {
    scale_ *= config_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ == config_.growth_interval) {
    const double grown = scale_ * config_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
}

}  // namespace nanscope
