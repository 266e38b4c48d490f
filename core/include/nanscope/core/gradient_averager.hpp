#pragma once
// What the step needs from data parallelism: every rank's gradients averaged
// in place, with a small flag vector summed in the same round trip.
// The trainer's c10d gradient buckets implement it; the core links no c10d.
//
// A sharded model (FSDP) is the other kind: its own backward reduced the
// gradients (each rank holds a shard of each), and its forward and backward
// are collectives themselves, so every rank re-runs a failing step together.
#include <ATen/ATen.h>

#include <stdexcept>

namespace nanscope {

class GradientAverager {
 public:
  virtual ~GradientAverager() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Averages each parameter's .grad across ranks and sums `flags` (each rank
  // writes its own slots, zeros elsewhere, so they can ride in the gradients'
  // own reduction); only the flags where the backward averaged the gradients
  // (below), or waits for their reduction begun before (begin_average, or
  // the Python binding's hook at DDP's last bucket).
  // Not called for a sharded model.
  virtual void average(const at::Tensor& flags) = 0;
  // Where the step's backward averaged the gradients itself (a
  // DistributedDataParallel model's own sync, overlapped with the backward),
  // this rank's own gradients before they mixed: a float 1 if they held a NaN
  // or an infinity, else 0. Undefined where no backward averaged them since
  // the last average(): there average() averages them.
  virtual at::Tensor own_gradients_nonfinite() { return {}; }
  // Where the backward averaged the gradients: starts summing `flags`
  // without waiting, once the backward is over (the watched form's
  // unscale(), so the reduction overlaps the loop's clipping); average() of
  // the same flags then waits for it. The default starts nothing.
  virtual void begin_average(const at::Tensor& /*flags*/) {}
  // The model is sharded: its backward reduced the gradients, and a re-run of
  // its forward is a collective every rank takes part in.
  virtual bool sharded() const { return false; }
  // Sums `values` across ranks in place (one collective): a sharded model's
  // flags and the squared norms of its gradient shards, the verdicts of a
  // search's replays. Only where sums() says so.
  virtual bool sums() const { return false; }
  virtual void sum(const at::Tensor& /*values*/) {
    throw std::logic_error("GradientAverager::sum: this averager does not sum");
  }
  // Starts summing `values` without waiting (a sharded model's flags and
  // shard norms, at the watched form's unscale()); sum() of the same tensor
  // then waits for it. The default starts nothing, and sum() does it all.
  virtual void begin_sum(const at::Tensor& /*values*/) {}
  // Whether every rank's `mine` holds (one sum): a verdict each rank of a
  // sharded model reaches on its own shards, made common.
  bool every_rank(bool mine) {
    at::Tensor no = at::full({1}, mine ? 0.0f : 1.0f);
    sum(no);
    return no.item<float>() == 0.0f;
  }
};

}  // namespace nanscope
