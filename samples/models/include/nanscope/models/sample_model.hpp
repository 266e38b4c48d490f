#pragma once
// What the built-in models (gpt, mlp) share beyond NativeModel: they host
// nanscope-train's planted faults (--fault) and its z-loss (--z-loss), and
// their loss is a language model's cross-entropy.
#include <ATen/ATen.h>

#include <memory>

#include "nanscope/core/native_model.hpp"
#include "nanscope/models/fault_host.hpp"

namespace nanscope {

class SampleModel : public NativeModel, public FaultHost {
 public:
  void set_z_loss(double coefficient) override { z_loss_ = coefficient; }
  // Every model-side fault kind; batch and LR faults are the loop's.
  bool plant_fault(const Fault& fault) override;

 protected:
  using NativeModel::NativeModel;
  // The fault to plant in this forward; the step guard clears it after the step.
  FaultKind fault_ = FaultKind::none;
  double fault_arg_ = 0;
  double z_loss_ = 0;
  // Cross-entropy (+ z-loss, P15), or the planted exp-overflow variant.
  at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) const;
};

}  // namespace nanscope
