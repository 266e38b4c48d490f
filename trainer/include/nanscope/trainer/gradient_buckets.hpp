#pragma once
// Averages gradients across ranks the way DDP does it: parameters packed in
// reverse order (the order backward produces their gradients) into flat
// buckets of about --bucket-mb, one all-reduce per bucket with every bucket in
// flight at once, instead of one collective per parameter. The guard's flags
// ride at the end of the last float32 bucket: a step's collectives are the
// buckets' alone.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/trainer/distributed.hpp"

namespace nanscope::trainer {

class GradientBuckets : public GradientAverager {
 public:
  GradientBuckets(ProcessGroup& group, const std::vector<at::Tensor>& parameters, double bucket_mb);

  // Every rank's gradients summed and divided by the world size, written back
  // into each parameter's .grad (a parameter this rank did not use gets the
  // average of the others'). `flags` ride along in the last float32 bucket,
  // summed (each rank writes its own slots). Throws DistributedError if a peer is gone.
  void average(const at::Tensor& flags) override;

  // Sums `values` across ranks in place: the guard's agreement on a failed step's remedy.
  bool sums() const override { return true; }
  void sum(const at::Tensor& values) override { group_.all_reduce({values}); }

  size_t bucket_count() const { return buckets_.size(); }
  int rank() const override { return group_.rank(); }
  int world_size() const override { return group_.world_size(); }

 private:
  struct Slot {
    size_t parameter;  // index into parameters_
    int64_t offset, numel;
  };
  struct Bucket {
    at::Tensor flat;
    std::vector<Slot> slots;
  };
  // The tensor a step reduces for `bucket`: its flat buffer, with the flags
  // after it where they ride (the last float32 bucket; `riding_` grows to
  // hold them once, its front the bucket's buffer from then on).
  at::Tensor reduced(Bucket& bucket, const at::Tensor& flags);
  ProcessGroup& group_;
  std::vector<at::Tensor> parameters_;
  std::vector<Bucket> buckets_;
  size_t carrier_ = SIZE_MAX;  // the bucket the flags ride in (the last float32 one); SIZE_MAX: none
  at::Tensor riding_;          // the carrier's buffer and the flags, one tensor
};

}  // namespace nanscope::trainer
