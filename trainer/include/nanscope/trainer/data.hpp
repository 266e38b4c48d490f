#pragma once
// Training data: a whole dataset held in memory as two tensors, and the
// stateless mapping from a step to its batch rows (so any step's batch can be
// rebuilt from the step number alone, which replay relies on).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace nanscope::trainer {

struct Dataset {
  at::Tensor inputs;   // [samples, ...]
  at::Tensor targets;  // [samples, ...]
  std::string source;  // a file name or a description of the built-in data
  int64_t size() const { return inputs.size(0); }
};

// Reads --data (throws format::FormatError naming the file).
Dataset load_dataset(const std::string& path);
// Byte-level windows of `seq_len`+1 over a text every Debian system has
// (/usr/share/common-licenses/GPL-3, from base-files).
Dataset builtin_text_dataset(int64_t seq_len);
// A seeded teacher task: x ~ N(0, 1)^features, y = argmax(x W) for a fixed random W.
Dataset builtin_teacher_dataset(int64_t samples, int64_t features, int64_t classes, uint64_t seed);

class BatchSampler {
 public:
  // With several ranks, batch_size is per rank and rank R reads rows
  // [R*B, (R+1)*B) of each global batch of B x world_size: together the ranks
  // read exactly what one process with the global batch would.
  BatchSampler(int64_t dataset_size, int64_t batch_size, bool shuffle, uint64_t seed, int rank = 0, int world_size = 1);
  // Rows of batch `step`: without shuffle rows [step*B, (step+1)*B) wrapping
  // around; with shuffle, the same positions in a seeded per-epoch permutation.
  at::Tensor rows(int64_t step) const;

 private:
  int64_t size_, batch_size_, rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
};

}  // namespace nanscope::trainer
