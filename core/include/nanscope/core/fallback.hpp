#pragma once
// The stock loop's one-shot fallback: on the first non-finite step, disable
// AMP and cast model and optimizer state to fp32; never more than once (the
// guard cuts the LR with it, in its one LR cut). When it fires is decided with every other
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
  explicit FallbackPolicy(FallbackMode mode) : mode_(mode) {}
  FallbackMode mode() const { return mode_; }

  // Casts model and optimizer state to fp32 and turns the scaler off. The
  // caller switches autocast off and cuts the LR.
  void fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler, at::Device device,
            int64_t step);

  bool fired() const { return fired_step_ >= 0; }
  // A resumed run whose fallback had fired (the caller restores precision and scaler).
  void restore_fired(int64_t step) { fired_step_ = step; }
  int64_t fired_step() const { return fired_step_; }

 private:
  FallbackMode mode_;
  int64_t fired_step_ = -1;
};

}  // namespace nanscope
