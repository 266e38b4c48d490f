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

  // Casts model and optimizer state to fp32 and turns the scaler off; the
  // caller switches autocast off and cuts the LR. A model whose weights are
  // 16-bit (trained in bf16 or fp16 itself) keeps them, its optimizer state and
  // its scaler: widening would change the dtype its loop feeds it and double
  // its memory, so its fallback is the LR cut alone. Returns whether the model
  // now runs in fp32.
  bool fire(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler, at::Device device,
            int64_t step);
  // The model keeps its own 16-bit weights through the fallback.
  static bool keeps_own_precision(const TrainableModel& model);

  bool fired() const { return fired_step_ >= 0; }
  // A resumed run whose fallback had fired (the caller restores precision and scaler).
  void restore_fired(int64_t step) { fired_step_ = step; }
  int64_t fired_step() const { return fired_step_; }

 private:
  FallbackMode mode_;
  int64_t fired_step_ = -1;
};

}  // namespace nanscope
