#include "nanscope/core/fallback.hpp"

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

bool FallbackPolicy::keeps_own_precision(const TrainableModel& model) {
  const at::ScalarType own = model.own_float_type();
  return own == at::kBFloat16 || own == at::kHalf;
}

bool FallbackPolicy::fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                          at::Device device, int64_t step) {
  (void)device;  // the model stays where it is
  fired_step_ = step;
  if (keeps_own_precision(model)) return false;
  model.widen_to_fp32();
  cast_optimizer_state(optimizer, at::kFloat);
  scaler.disable();
  return true;
}

}  // namespace nanscope
