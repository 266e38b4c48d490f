#pragma once
// Shared plumbing for the built-in C++ models: parameters, buffers, device and
// dtype moves and train/eval mode come from the wrapped torch::nn::Module.
#include <torch/nn/module.h>

#include <memory>

#include "nanscope/core/model.hpp"

namespace nanscope {

class NativeModel : public TrainableModel {
 public:
  NamedTensors all_named_parameters() const override;
  NamedTensors named_buffers() const override;
  std::vector<std::string> module_paths() const override;  // named_modules(), containers included
  void set_training(bool on) override;
  void set_z_loss(double coefficient) override { z_loss_ = coefficient; }

 protected:
  explicit NativeModel(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}
  // The built-ins' FaultHost::plant_fault: every model-side fault kind (batch
  // and LR faults are the loop's).
  bool host_fault(const Fault& fault);
  // The fault to plant in this forward; the step guard clears it after the step.
  FaultKind fault_ = FaultKind::none;
  double fault_arg_ = 0;
  double z_loss_ = 0;
  // Cross-entropy (+ z-loss, P15), or the planted exp-overflow variant.
  at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace nanscope
