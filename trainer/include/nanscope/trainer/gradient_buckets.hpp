#pragma once
// Averages gradients across ranks the way DDP does it: parameters packed in
// reverse order (the order backward produces their gradients) into flat
// buckets of about --bucket-mb, one all-reduce per bucket with every bucket in
// flight at once, instead of one collective per parameter.
#include <ATen/ATen.h>

#include <vector>

#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/trainer/distributed.hpp"

namespace nanscope::trainer {

class GradientBuckets : public GradientAverager {
 public:
  GradientBuckets(ProcessGroup& group, const std::vector<at::Tensor>& parameters, double bucket_mb);

  // Every rank's gradients summed and divided by the world size, written back
  // into each parameter's .grad (a parameter this rank did not use gets the
  // average of the others'). `flags` ride along in the same round trip,
  // reduced with MAX. Throws DistributedError if a peer is gone.
  void average(const at::Tensor& flags) override;

  // Sums `values` across ranks in place: the guard's agreement on a failed step's remedy.
  bool sums() const override { return true; }
  void sum(const at::Tensor& values) override { group_.all_reduce({{values, ProcessGroup::Reduce::sum}}); }

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
  ProcessGroup& group_;
  std::vector<at::Tensor> parameters_;
  std::vector<Bucket> buckets_;
};

}  // namespace nanscope::trainer
