#pragma once
// What the step needs from data parallelism: every rank's gradients averaged
// in place, with a small flag vector reduced (MAX) in the same round trip.
// The trainer's c10d gradient buckets implement it; the core links no c10d.
#include <ATen/ATen.h>

namespace nanscope {

class GradientAverager {
 public:
  virtual ~GradientAverager() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Averages each parameter's .grad across ranks and reduces `flags` with MAX.
  virtual void average(const at::Tensor& flags) = 0;
};

}  // namespace nanscope
