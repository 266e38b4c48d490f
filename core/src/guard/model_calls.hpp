#pragma once
// The watched form's calls of the guarded model between two micro-batches'
// backwards. A loop calls its model for more than its loss: sample images
// (DCGAN's netG(fixed_noise)), an evaluation or logging call with gradients
// on, a GAN's critic run in the generator's phase. Each call is marked where
// it begins and ends in autograd's sequence numbers, with the RNG state it
// began with; the call a micro-batch's loss depends on is the one whose nodes
// its graph holds. Decided on a failing step only: a clean step keeps the
// marks and the loss's root node (its saved tensors are freed by backward).
#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

struct ModelCall {
  CpuRngState cpu_rng_state;                                 // where the generator was when the call began
  uint64_t first_node = 0;                                   // autograd's next sequence number when the call began
  uint64_t end_node = std::numeric_limits<uint64_t>::max();  // ... when it returned (max: not seen)
  std::optional<Batch> batch;                                // its arguments (none when the loop named the micro-batch)
};

// Autograd's next sequence number on this thread: a call's nodes are numbered from here.
uint64_t next_autograd_node();

// A micro-batch whose loss came after several calls of the model.
struct UndecidedMicroBatch {
  size_t micro_batch = 0;  // its index in the step
  // The loss its backward ran from: its graph's root node stays alive with
  // it (the saved tensors are freed by backward, the edges kept).
  at::Tensor loss;
  std::vector<ModelCall> calls;  // oldest first
};

// The latest call whose nodes the loss's graph reaches, or nullopt when it
// reaches none of them (a loss built outside the model's calls).
std::optional<size_t> call_the_loss_used(const UndecidedMicroBatch& undecided);

}  // namespace nanscope
