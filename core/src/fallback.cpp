#include "nanscope/core/fallback.hpp"

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

bool FallbackPolicy::should_fire(Amp amp, const StepOutcome& outcome, const LossScaler& scaler) const {
  if (!enabled_ || fired() || outcome.finite()) return false;
  const bool scaler_handles_it =
      amp == Amp::fp16 && outcome.loss_finite && scaler.enabled() && scaler.scale() >= min_loss_scale_;
  return !scaler_handles_it;
}

void FallbackPolicy::fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                          at::Device device, int64_t step) {
  model.to(device, at::kFloat);
  cast_optimizer_state(optimizer, at::kFloat);
  scaler.disable();
  fired_step_ = step;
}

}  // namespace nanscope
