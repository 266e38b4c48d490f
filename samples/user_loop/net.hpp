// The user-loop example's model: a regressor on counts, which it log-transforms
// itself. Shared by the training program (user_loop.cpp) and the program that
// replays its snapshots (user_replay.cpp).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "nanscope/core/module_model.hpp"
#include "nanscope/probe/module_scope.hpp"

struct Net : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(4, 8))};
  torch::nn::Linear head{register_module("head", torch::nn::Linear(8, 1))};
  torch::Tensor forward(torch::Tensor counts) {
    torch::Tensor x;
    {
      NANSCOPE_MODULE_SCOPE("fc");  // births below are reported in module "fc"
      x = torch::relu(fc(torch::log1p(counts)));
    }
    NANSCOPE_MODULE_SCOPE("head");
    return head(x);
  }
};

// The model as nanscope trains and replays it, under the name its snapshots carry.
inline std::unique_ptr<nanscope::ModuleModel> make_model(std::shared_ptr<Net> net) {
  return std::make_unique<nanscope::ModuleModel>(
      "user_net", net, [net](const at::Tensor& x, const at::Tensor& y) { return torch::mse_loss(net->forward(x), y); });
}
