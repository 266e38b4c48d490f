#include "guard/model_calls.hpp"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

namespace nanscope {

uint64_t next_autograd_node() { return at::sequence_number::peek(); }

std::optional<size_t> call_the_loss_used(const UndecidedMicroBatch& undecided) {
  const std::vector<ModelCall>& calls = undecided.calls;
  // A call's nodes run from its first number to the end it was seen to
  // return at, or else up to the next call's first.
  auto end_of = [&](size_t i) {
    if (calls[i].end_node != std::numeric_limits<uint64_t>::max()) return calls[i].end_node;
    return i + 1 < calls.size() ? calls[i + 1].first_node : std::numeric_limits<uint64_t>::max();
  };
  std::vector<bool> reached(calls.size(), false);
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  // Edge::function is a shared_ptr in LibTorch 1.13 and 2.6, an intrusive_ptr in 2.14: only .get() is used.
  const auto root = undecided.loss.defined() && undecided.loss.requires_grad()
                        ? torch::autograd::impl::gradient_edge(undecided.loss).function
                        : decltype(torch::autograd::Edge::function){};
  if (root) stack.push_back(root.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    const uint64_t n = node->sequence_nr();
    for (size_t i = 0; i < calls.size(); ++i)
      if (n >= calls[i].first_node && n < end_of(i)) reached[i] = true;
    for (const torch::autograd::Edge& edge : node->next_edges())
      if (edge.function) stack.push_back(edge.function.get());
  }
  for (size_t i = calls.size(); i-- > 0;)
    if (reached[i]) return i;
  return std::nullopt;
}

}  // namespace nanscope
