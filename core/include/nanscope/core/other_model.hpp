#pragma once
// Another model the guarded step's loss runs besides the guarded one: a GAN's
// critic in the generator's loss. A guard told of it puts its buffers back
// after each re-run of a failed step (BatchNorm's statistics in train mode: a
// re-run is no step of the critic's), names a birth in it '<not in the model>
// LABEL.path', and keeps its weights in the step's snapshot. A replay loads
// them into the model given under the same label, or refuses, naming it:
//
//   generator_guard.add_other_model({"critic", critic});
//   ...
//   return nanscope::replay::replay_main(argc, argv, generator, generator_loss, {{"critic", critic}});
#include <memory>
#include <string>
#include <type_traits>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "nanscope/core/model.hpp"

namespace nanscope {

struct OtherModel {
  // Borrowed: the module must outlive the guard or the replay given it.
  OtherModel(std::string label, torch::nn::Module& module) : label(std::move(label)), module(&module) {}
  template <class M, std::enable_if_t<std::is_base_of_v<torch::nn::Module, M>, int> = 0>
  OtherModel(std::string label, const std::shared_ptr<M>& module) : label(std::move(label)), module(module.get()) {}
  template <class M>
  OtherModel(std::string label, const torch::nn::ModuleHolder<M>& module)
      : label(std::move(label)), module(module.ptr().get()) {}

  std::string label;
  torch::nn::Module* module;
};

// `other`'s parameters and buffers into `model`'s other models
// (TrainableModel::add_other_model). Throws std::invalid_argument for an
// empty module, a repeated label, or the model itself.
void add_other_model(TrainableModel& model, const OtherModel& other);

}  // namespace nanscope
