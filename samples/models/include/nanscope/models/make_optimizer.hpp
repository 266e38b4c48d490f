#pragma once
// The optimizer nanscope-train (and the benchmarks and tests) build for a
// model: the guard takes any torch::optim::Optimizer and builds none.
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "nanscope/models/optimizer_kind.hpp"

namespace nanscope {

// AdamW, or SGD with momentum 0.9; std::invalid_argument for another kind.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, const std::vector<at::Tensor>& parameters,
                                                        double lr, double weight_decay);

}  // namespace nanscope
