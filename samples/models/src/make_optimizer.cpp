#include "nanscope/models/make_optimizer.hpp"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace nanscope {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, const std::vector<at::Tensor>& parameters,
                                                        double lr, double weight_decay) {
  switch (kind) {
    case OptimizerKind::adamw:
      return std::make_unique<torch::optim::AdamW>(parameters,
                                                   torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
    case OptimizerKind::sgd:
      return std::make_unique<torch::optim::SGD>(parameters,
                                                 torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(weight_decay));
    case OptimizerKind::unknown: break;
  }
  throw std::invalid_argument("unknown optimizer (adamw or sgd)");
}

}  // namespace nanscope
