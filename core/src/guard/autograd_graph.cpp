#include "guard/autograd_graph.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>
#include <vector>

namespace nanscope {

void walk_backward_graph(const at::Tensor& loss, const std::function<bool(torch::autograd::Node&)>& visit) {
  if (!loss.defined() || !loss.requires_grad()) return;
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  // Edge::function is a shared_ptr in LibTorch 1.13 and 2.6, an intrusive_ptr in 2.14: only .get() is used.
  if (const auto root = torch::autograd::impl::gradient_edge(loss).function) stack.push_back(root.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (!visit(*node)) return;
    for (const torch::autograd::Edge& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
}

}  // namespace nanscope
