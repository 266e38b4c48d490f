#pragma once
// Your own torch::nn::Module as a TrainableModel: what StepGuard trains and
// what nanscope-replay rebuilds (replay/model_registry.hpp) under `name`.
//
//   auto net = std::make_shared<Net>();
//   nanscope::ModuleModel model("my_net", net, [net](const at::Tensor& x, const at::Tensor& y) {
//     return torch::mse_loss(net->forward(x), y);
//   });
//
// The loss function runs the forward and returns a scalar loss. Name modules
// with NANSCOPE_MODULE_SCOPE inside forward for births to name them.
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "nanscope/core/models/native_model.hpp"

namespace nanscope {

using LossFunction = std::function<at::Tensor(const at::Tensor& inputs, const at::Tensor& targets)>;

class ModuleModel : public NativeModel {
 public:
  // `hparams` travel in snapshots to the factory that rebuilds the model.
  ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, LossFunction loss,
              std::map<std::string, int64_t> hparams = {});

  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override { return loss_(inputs, targets); }
  ModelSpec spec() const override { return {name_, hparams_, ""}; }

 private:
  std::string name_;
  LossFunction loss_;
  std::map<std::string, int64_t> hparams_;
};

}  // namespace nanscope
