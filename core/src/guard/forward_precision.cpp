#include "guard/forward_precision.hpp"

#include "guard/autograd_graph.hpp"

#include <torch/csrc/autograd/function.h>

#include <string>

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
  ProductPrecision seen = ProductPrecision::none_seen;
  size_t nodes = 0;
  walk_backward_graph(loss, [&](torch::autograd::Node& node) {
    if (node.num_inputs() > 0 && autocast_lowers(node.name())) {
      const at::ScalarType made = node.input_metadata(0).dtype().toScalarType();
      if (made == at::kBFloat16 || made == at::kHalf) {
        seen = ProductPrecision::sixteen_bit;
        return false;
      }
      seen = ProductPrecision::float32;
    }
    return ++nodes < kMostNodes;
  });
  return seen;
}

}  // namespace nanscope
