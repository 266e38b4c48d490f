#pragma once
// What a watched step keeps of each micro-batch for a re-run and the
// snapshot: the micro-batch as it was at its backward. A copy costs a pass
// over the batch at every clean step (0.2 ms for a 2.5 MB batch on one
// core), and most loops never write into a batch after its backward. So the
// loop's own tensors are kept with their version counters, which every
// in-place write moves, and step() reads them again. A write that bypasses
// the counter (through a numpy view, `.data`, DLPack: a data loader filling
// its buffer) is looked for in a sample of each tensor's bytes, taken at the
// backward and read again at step(): 64 elements spread over it, or all of
// a small tensor (a refill with new data changes them; a few changed
// elements can escape the sample). Only host tensors are kept so; a device
// tensor is copied (an asynchronous device copy). The first watched step is
// kept as a copy too, and so is every step after a loop was seen writing
// into a micro-batch after its backward (a staging buffer refilled for the
// next micro-batch, DCGAN's label.fill_, a clean-up in place): such a loop
// writes so on its first step. A write first seen later leaves that step's
// re-run on the new values, and its first birth says so.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

// One tensor of the loop's micro-batch, with its version counter at the backward.
struct LoopTensor {
  size_t micro_batch = 0;
  at::Tensor tensor;
  int64_t version = 0;
  bool copied = false;          // the step kept a copy of it: a later write changes nothing kept
  std::vector<uint8_t> sample;  // some of its bytes at the backward, where it could be kept as it is
};

class KeptBatches {
 public:
  // The doom search replays micro-batches of earlier steps, after the loop
  // has refilled its buffers: it needs copies always.
  void copy_always() { copy_always_ = true; }

  // At a micro-batch's backward: the batch a re-run will use, the loop's own
  // or a copy (written into a spare where one is free). Its tensors and their
  // versions go into `loops`, the copy's tensors into `copies`.
  Batch keep(const Batch& batch, size_t micro_batch, std::vector<LoopTensor>& loops, std::vector<at::Tensor>& copies);
  // At step(): the micro-batches kept as the loop's own that the loop wrote
  // into since their backward, each once, in order. A write seen, copied or
  // not, makes every later step keep copies.
  std::vector<size_t> written_since_backward(const std::vector<LoopTensor>& loops);
  // The step let go of its copies: the next one writes into them.
  void spare(std::vector<at::Tensor> copies) { spares_ = std::move(copies); }

 private:
  bool copy_always_ = false;
  // Copies until a step shows whether the loop writes into its micro-batches after their backwards.
  bool checked_a_step_ = false;
  bool writes_seen_ = false;  // sticks: a loop that wrote after a backward once keeps copies
  std::vector<at::Tensor> spares_;
};

}  // namespace nanscope
