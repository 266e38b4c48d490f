#include "guard/model_calls.hpp"

#include "guard/autograd_graph.hpp"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>

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
  walk_backward_graph(undecided.loss, [&](torch::autograd::Node& node) {
    const uint64_t n = node.sequence_nr();
    for (size_t i = 0; i < calls.size(); ++i)
      if (n >= calls[i].first_node && n < end_of(i)) reached[i] = true;
    return true;
  });
  for (size_t i = calls.size(); i-- > 0;)
    if (reached[i]) return i;
  return std::nullopt;
}

}  // namespace nanscope
