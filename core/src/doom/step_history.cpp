#include "nanscope/core/step_history.hpp"

namespace nanscope {

size_t StepRecord::bytes() const {
  size_t n = 0;
  for (const MicroBatch& m : micro_batches) {
    for (const at::Tensor& t : m.batch.tensors())
      if (t.defined()) n += size_t(t.numel()) * t.element_size();
    n += size_t(m.cpu_rng_state.size_bytes());
  }
  return n;
}

void StepHistory::add(StepRecord record) {
  bytes_ += record.bytes();
  records_.push_back(std::move(record));
  while (bytes_ > max_bytes_ && !records_.empty()) {
    bytes_ -= records_.front().bytes();
    dropped_through_ = records_.front().step;
    records_.pop_front();
  }
}

void StepHistory::forget_through(int64_t step) {
  while (!records_.empty() && records_.front().step <= step) {
    bytes_ -= records_.front().bytes();
    records_.pop_front();
  }
}

void StepHistory::forget_from(int64_t step) {
  while (!records_.empty() && records_.back().step >= step) {
    bytes_ -= records_.back().bytes();
    records_.pop_back();
  }
}

std::vector<const StepRecord*> StepHistory::between(int64_t after, int64_t before) const {
  if (dropped_through_ > after) return {};
  std::vector<const StepRecord*> out;
  for (const StepRecord& r : records_)
    if (r.step > after && r.step < before) out.push_back(&r);
  return out;
}

}  // namespace nanscope
