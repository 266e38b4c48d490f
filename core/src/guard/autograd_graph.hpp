#pragma once
// A walk over the autograd graph a loss's backward runs: the watched form
// reads it to tell which model call a loss used (model_calls.hpp) and what
// precision its forward ran in (forward_precision.hpp). Private to core.
#include <functional>

#include <ATen/ATen.h>

namespace torch::autograd {
struct Node;
}

namespace nanscope {

// visit(node) for each node reachable from `loss`'s gradient function, once
// each; the walk stops where visit returns false. Nothing for a tensor with
// no graph (undefined, or not requiring grad).
void walk_backward_graph(const at::Tensor& loss, const std::function<bool(torch::autograd::Node&)>& visit);

}  // namespace nanscope
