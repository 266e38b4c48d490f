#pragma once
// Your own torch::nn::Module as a TrainableModel: what StepGuard trains and
// what nanscope-replay rebuilds (replay/model_registry.hpp) under `name`.
//
//   auto net = std::make_shared<Net>();
//   nanscope::ModuleModel model("my_net", net, [net](const at::Tensor& x, const at::Tensor& y) {
//     return torch::mse_loss(net->forward(x), y);
//   });
//
// The loss function runs the forward and returns a scalar loss. Births are
// named by module without changes to forward (an op belongs to the module
// whose parameters or buffers it reads, or to the innermost module around it);
// NANSCOPE_MODULE_SCOPE inside forward names them exactly. A loop of your own
// needs none of this: StepGuard(module, optimizer, options) and
// guard.closure_step(closure, batch) (step_guard.hpp).
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "nanscope/core/loss_closure.hpp"
#include "nanscope/core/native_model.hpp"

namespace nanscope {

using LossFunction = std::function<at::Tensor(const at::Tensor& inputs, const at::Tensor& targets)>;

class ModuleModel : public NativeModel {
 public:
  // `hparams` travel in snapshots to the factory that rebuilds the model.
  ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, LossFunction loss,
              std::map<std::string, int64_t> hparams = {});
  // A module the caller owns (on the stack, in its own program): the model
  // refers to it and must not outlive it.
  static std::unique_ptr<ModuleModel> borrowing(std::string name, torch::nn::Module& module, LossFunction loss = {});

  // The loss over a whole batch of any structure (a nested batch: data,
  // targets and a carried state), in place of the (inputs, targets) one.
  void set_batch_loss(BatchLoss loss) { batch_loss_ = std::move(loss); }

  // Throws std::logic_error for a model built without a loss function (the
  // body of a closure step: StepGuard(module, ...)).
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;
  at::Tensor loss(const Batch& batch) override;
  ModelSpec spec() const override { return {name_, hparams_, ""}; }

 private:
  std::string name_;
  LossFunction loss_;
  BatchLoss batch_loss_;
  std::map<std::string, int64_t> hparams_;
};

}  // namespace nanscope
