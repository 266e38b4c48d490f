#pragma once
// A TrainableModel over a torch::nn::Module: parameters, buffers, module paths,
// device and dtype moves and train/eval mode come from the wrapped module.
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

 protected:
  explicit NativeModel(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}

 private:
  std::shared_ptr<torch::nn::Module> module_;
};

}  // namespace nanscope
