#include "guard/forward_precision.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace nanscope {
namespace {

// The nodes of the ops autocast lowers to 16 bits: matrix products (mm,
// addmm, bmm, baddbmm: linear layers and attention) and convolutions.
bool autocast_lowers(const std::string& node) {
  return node.find("mmBackward") != std::string::npos || node.find("Conv") != std::string::npos;
}

// A graph bigger than this is not walked to its end: its first nodes decide.
constexpr size_t kMostNodes = 100000;

}  // namespace

ProductPrecision product_precision(const at::Tensor& loss) {
  if (!loss.defined() || !loss.requires_grad()) return ProductPrecision::none_seen;
  ProductPrecision seen = ProductPrecision::none_seen;
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> visited;
  // Edge::function is a shared_ptr in LibTorch 1.13, an intrusive_ptr in 2.14: only .get() is used.
  if (const auto root = torch::autograd::impl::gradient_edge(loss).function) stack.push_back(root.get());
  while (!stack.empty() && visited.size() < kMostNodes) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!visited.insert(node).second) continue;
    if (node->num_inputs() > 0 && autocast_lowers(node->name())) {
      const at::ScalarType made = node->input_metadata(0).dtype().toScalarType();
      if (made == at::kBFloat16 || made == at::kHalf) return ProductPrecision::sixteen_bit;
      seen = ProductPrecision::float32;
    }
    for (const torch::autograd::Edge& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  return seen;
}

}  // namespace nanscope
