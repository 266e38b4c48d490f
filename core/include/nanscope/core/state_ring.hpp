#pragma once
// The last few good training states, kept in host memory so a run can go back
// to one without a checkpoint file or a restart: the weights and buffers, the
// optimizer's state (any torch::optim optimizer: copied by itself, or saved
// through its own serialization), the loss scaler, and the CPU (and CUDA) random generators.
// The data position and the LR schedule are not saved: a rollback does not
// rewind them (docs/sentinel.md).
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/optimizer.hpp"

namespace nanscope {

struct TrainingState {
  int64_t step = -1;                            // the state as it was after this step's update
  std::vector<at::Tensor> parameters, buffers;  // host copies, in named_parameters()/named_buffers() order
  SavedOptimizer optimizer;                     // its own copy, or its serialization
  LossScaler scaler;
  at::Tensor cpu_rng;
  at::Tensor device_rng;  // the parameters' CUDA device's generator; undefined on CPU
  size_t bytes() const;   // host memory held
};

class StateRing {
 public:
  // Holds at most `max_states` states and at most `max_bytes` bytes of them.
  StateRing(size_t max_states, size_t max_bytes);

  // Copies the state after `step` in, dropping the oldest when full. Returns
  // false (and keeps nothing) when one state alone is larger than the budget.
  bool save(int64_t step, const TrainableModel& model, const torch::optim::Optimizer& optimizer,
            const LossScaler& scaler);
  // The oldest state kept (the furthest a search back in time can reach); nullptr if none.
  const TrainingState* oldest() const { return states_.empty() ? nullptr : &states_.front(); }
  // The newest state saved after a step before `step`; nullptr if none.
  const TrainingState* newest_before(int64_t step) const;
  // Puts `state` back: weights, buffers, optimizer state (its param groups'
  // options included), scaler and generators, bit for bit.
  static void restore(const TrainingState& state, TrainableModel& model, torch::optim::Optimizer& optimizer,
                      LossScaler& scaler);
  // Drops the states saved after a step at or after `step` (a rolled-back future).
  void forget_from(int64_t step);

  size_t size() const { return states_.size(); }
  size_t bytes() const;
  size_t max_states() const { return max_states_; }
  size_t max_bytes() const { return max_bytes_; }

 private:
  size_t max_states_, max_bytes_;
  std::deque<TrainingState> states_;  // oldest first
};

}  // namespace nanscope
