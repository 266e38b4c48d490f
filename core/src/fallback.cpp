#include "nanscope/core/fallback.hpp"

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

void FallbackPolicy::fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                          at::Device device, int64_t step) {
  (void)device;  // the model stays where it is
  model.widen_to_fp32();
  cast_optimizer_state(optimizer, at::kFloat);
  scaler.disable();
  fired_step_ = step;
}

}  // namespace nanscope
