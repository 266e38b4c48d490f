#pragma once
// What a StepGuard is given to train, however the loop holds it.
#include <memory>
#include <type_traits>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "nanscope/core/model.hpp"

namespace nanscope {

// What a guard trains, however the loop holds it. A torch module (a plain
// object, a shared_ptr or a TORCH_MODULE holder: borrowed, it must outlive the
// guard) or an owned TrainableModel is trained by the closure step; a
// borrowed TrainableModel by closure_step(inputs, targets) (nanscope-train).
class GuardedModel {
 public:
  GuardedModel(torch::nn::Module& module) : module_(&module) {}
  template <class M, std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>, int> = 0>
  GuardedModel(const std::shared_ptr<M>& module) : module_(module.get()) {}
  template <class M>
  GuardedModel(const torch::nn::ModuleHolder<M>& module) : module_(module.ptr().get()) {}
  GuardedModel(TrainableModel& model) : model_(&model) {}
  template <class M, std::enable_if_t<std::is_base_of_v<TrainableModel, M>, int> = 0>
  GuardedModel(std::unique_ptr<M> owned) : owned_(std::move(owned)) {}

  // What was given; the guard reads it once, as it is built.
  torch::nn::Module* module() const { return module_; }
  TrainableModel* borrowed_model() const { return model_; }
  std::unique_ptr<TrainableModel> take_owned_model() { return std::move(owned_); }

 private:
  torch::nn::Module* module_ = nullptr;
  TrainableModel* model_ = nullptr;
  std::unique_ptr<TrainableModel> owned_;
};

}  // namespace nanscope
