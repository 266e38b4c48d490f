#pragma once
// The stock loop's one-shot fallback: on the first non-finite step, disable
// AMP, cast model and optimizer state to fp32 and multiply the LR by the
// backoff; never more than once. When it fires is decided with every other
// recovery (recovery.hpp): FallbackMode::automatic fires it only when the
// step's diagnosis finds nothing smaller to do (remedy.hpp).
#include <torch/optim/optimizer.h>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/precision.hpp"

namespace nanscope {

class FallbackPolicy {
 public:
  FallbackPolicy(FallbackMode mode, double lr_backoff) : mode_(mode), lr_backoff_(lr_backoff) {}
  FallbackMode mode() const { return mode_; }

  // Casts model and optimizer state to fp32 and turns the scaler off. The
  // caller switches autocast off and applies lr_multiplier().
  void fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler, at::Device device,
            int64_t step);

  bool fired() const { return fired_step_ >= 0; }
  // A resumed run whose fallback had fired (the caller restores precision and scaler).
  void restore_fired(int64_t step) { fired_step_ = step; }
  int64_t fired_step() const { return fired_step_; }
  // The LR multiplier in force: 1 before the fallback, lr_backoff after.
  double lr_multiplier() const { return fired() ? lr_backoff_ : 1.0; }

 private:
  FallbackMode mode_;
  double lr_backoff_;
  int64_t fired_step_ = -1;
};

}  // namespace nanscope
