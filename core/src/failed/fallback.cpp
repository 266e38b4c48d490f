#include "nanscope/core/fallback.hpp"

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

bool FallbackPolicy::keeps_own_precision(const TrainableModel& model) { return !model.own_16bit_type_name().empty(); }

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
