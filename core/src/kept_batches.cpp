#include "kept_batches.hpp"

#include <algorithm>

namespace nanscope {
namespace {

// An inference tensor has no version counter (and takes in-place writes
// inside torch.inference_mode()), and a re-run's backward would add to the
// .grad of a tensor that requires one, where the loop reads it (an
// adversarial step's input gradient): only a copy keeps those.
bool keeps_as_is(const at::Tensor& t) { return !t.is_inference() && !t.requires_grad(); }

}  // namespace

Batch KeptBatches::keep(const Batch& batch, size_t micro_batch, std::vector<LoopTensor>& loops,
                        std::vector<at::Tensor>& copies) {
  const std::vector<at::Tensor> tensors = batch.tensors();
  const bool copy =
      copy_always_ || writes_seen_ || !checked_a_step_ || !std::all_of(tensors.begin(), tensors.end(), keeps_as_is);
  for (const at::Tensor& t : tensors)
    if (!t.is_inference()) loops.push_back(LoopTensor{micro_batch, t, int64_t(t._version()), copy});
  if (!copy) return batch;
  Batch kept = batch.copied(&spares_);
  for (const at::Tensor& t : kept.tensors()) copies.push_back(t);
  return kept;
}

std::vector<size_t> KeptBatches::written_since_backward(const std::vector<LoopTensor>& loops) {
  std::vector<size_t> changed;
  bool written = false;
  for (const LoopTensor& t : loops) {
    if (int64_t(t.tensor._version()) == t.version) continue;
    written = true;
    if (!t.copied && std::find(changed.begin(), changed.end(), t.micro_batch) == changed.end())
      changed.push_back(t.micro_batch);
  }
  writes_seen_ = writes_seen_ || written;
  checked_a_step_ = checked_a_step_ || !loops.empty();  // a step that kept nothing shows nothing
  return changed;
}

}  // namespace nanscope
