#include "guard/kept_batches.hpp"

#include <algorithm>
#include <cstring>

namespace nanscope {
namespace {

// An inference tensor has no version counter (and takes in-place writes
// inside torch.inference_mode()), a re-run's backward would add to the
// .grad of a tensor that requires one, where the loop reads it (an
// adversarial step's input gradient), and only a dense host tensor's bytes
// can be sampled without a dispatch: a copy keeps the others.
bool keeps_as_is(const at::Tensor& t) {
  return !t.is_inference() && !t.requires_grad() && t.layout() == at::kStrided && t.device().is_cpu() &&
         t.is_contiguous() && !t.key_set().has(c10::DispatchKey::Python) && t.has_storage() &&
         (t.numel() == 0 || t.storage().data() != nullptr);
}

// Up to 64 of a tensor's elements, evenly spread from its first to its
// last; all of a tensor of 1 KB or less.
std::vector<uint8_t> sampled_bytes(const at::Tensor& t) {
  constexpr int64_t kSamples = 64, kWhole = 1024;
  const auto* data = static_cast<const uint8_t*>(t.data_ptr());
  const int64_t size = int64_t(t.element_size()), n = t.numel();
  if (n * size <= kWhole) return std::vector<uint8_t>(data, data + n * size);
  std::vector<uint8_t> out(size_t(kSamples * size));
  for (int64_t j = 0; j < kSamples; ++j)
    std::memcpy(out.data() + j * size, data + (j * (n - 1) / (kSamples - 1)) * size, size_t(size));
  return out;
}

}  // namespace

Batch KeptBatches::keep(const Batch& batch, size_t micro_batch, std::vector<LoopTensor>& loops,
                        std::vector<at::Tensor>& copies) {
  const std::vector<at::Tensor> tensors = batch.tensors();
  const bool copy =
      copy_always_ || writes_seen_ || !checked_a_step_ || !std::all_of(tensors.begin(), tensors.end(), keeps_as_is);
  // Detached where it requires grad (its version counter is the same): the
  // graph that made it is not held until step().
  for (const at::Tensor& t : tensors)
    if (!t.is_inference())
      loops.push_back(LoopTensor{micro_batch, t.requires_grad() ? t.detach() : t, int64_t(t._version()), copy,
                                 keeps_as_is(t) ? sampled_bytes(t) : std::vector<uint8_t>{}});
  if (!copy) return batch;
  Batch kept = batch.copied(&spares_);
  for (const at::Tensor& t : kept.tensors()) copies.push_back(t);
  return kept;
}

std::vector<size_t> KeptBatches::written_since_backward(const std::vector<LoopTensor>& loops) {
  std::vector<size_t> changed;
  bool written = false;
  for (const LoopTensor& t : loops) {
    // The sample is read again only while the tensor is laid out as it was sampled.
    const bool unmoved = int64_t(t.tensor._version()) == t.version;
    if (unmoved && (t.sample.empty() || (keeps_as_is(t.tensor) && sampled_bytes(t.tensor) == t.sample))) continue;
    written = true;
    if (!t.copied && std::find(changed.begin(), changed.end(), t.micro_batch) == changed.end())
      changed.push_back(t.micro_batch);
  }
  writes_seen_ = writes_seen_ || written;
  checked_a_step_ = checked_a_step_ || !loops.empty();  // a step that kept nothing shows nothing
  return changed;
}

}  // namespace nanscope
