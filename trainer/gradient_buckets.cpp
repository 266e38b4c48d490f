#include "nanscope/trainer/gradient_buckets.hpp"

#include <c10/core/GradMode.h>
#include <stdexcept>

namespace nanscope::trainer {

GradientBuckets::GradientBuckets(ProcessGroup& group, const std::vector<at::Tensor>& parameters, double bucket_mb)
    : group_(group), parameters_(parameters) {
  const auto cap_bytes = static_cast<int64_t>(bucket_mb * 1024 * 1024);
  std::vector<std::vector<Slot>> layout;
  int64_t bytes = 0, numel = 0;
  at::ScalarType dtype = at::kFloat;
  for (size_t i = parameters.size(); i-- > 0;) {
    const at::Tensor& p = parameters[i];
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    // A new bucket when this one is full, or when the dtype changes (one flat
    // buffer has one dtype).
    if (layout.empty() || (bytes > 0 && bytes + size > cap_bytes) || p.scalar_type() != dtype) {
      layout.emplace_back();
      bytes = numel = 0;
      dtype = p.scalar_type();
    }
    layout.back().push_back({i, numel, p.numel()});
    bytes += size;
    numel += p.numel();
  }
  for (auto& slots : layout) {
    const at::Tensor& first = parameters_[slots.front().parameter];
    const int64_t total = slots.back().offset + slots.back().numel;
    buckets_.push_back({at::empty({total}, first.options().requires_grad(false)), std::move(slots)});
  }
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].flat.scalar_type() == at::kFloat) carrier_ = i;
}

at::Tensor GradientBuckets::reduced(Bucket& bucket, const at::Tensor& flags) {
  if (carrier_ >= buckets_.size() || &bucket != &buckets_[carrier_] || flags.device() != bucket.flat.device())
    return bucket.flat;
  const int64_t size = bucket.flat.numel();
  if (riding_.numel() != size + flags.numel()) {
    riding_ = at::empty({size + flags.numel()}, bucket.flat.options());
    bucket.flat = riding_.narrow(0, 0, size);
  }
  riding_.narrow(0, size, flags.numel()).copy_(flags);
  return riding_;
}

void GradientBuckets::average(const at::Tensor& flags) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> reductions;
  reductions.reserve(buckets_.size() + 1);
  bool rode = false;
  for (Bucket& b : buckets_) {
    reductions.push_back(reduced(b, flags));  // first: it may move the bucket's buffer
    rode |= reductions.back().numel() > b.flat.numel();
    for (const Slot& s : b.slots) {
      at::Tensor slice = b.flat.narrow(0, s.offset, s.numel);
      const at::Tensor& grad = parameters_[s.parameter].grad();
      if (grad.defined())
        slice.copy_(grad.reshape({-1}));
      else
        slice.zero_();
    }
  }
  if (!rode) reductions.push_back(flags);
  group_.all_reduce(reductions);
  if (rode) flags.copy_(riding_.narrow(0, buckets_[carrier_].flat.numel(), flags.numel()));

  const double inverse_world = 1.0 / group_.world_size();
  for (Bucket& b : buckets_) {
    b.flat.mul_(inverse_world);
    for (const Slot& s : b.slots) {
      at::Tensor param = parameters_[s.parameter];
      at::Tensor averaged = b.flat.narrow(0, s.offset, s.numel).view(param.sizes());
      if (param.grad().defined())
        param.mutable_grad().copy_(averaged);
      else
        param.mutable_grad() = averaged.clone();
    }
  }
}

}  // namespace nanscope::trainer
