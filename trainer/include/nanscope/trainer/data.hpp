#pragma once
// Training data: a whole dataset held in memory as two tensors, and the
// stateless mapping from a step to its batch rows (so any step's batch can be
// rebuilt from the step number alone, which replay relies on).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/format/poison_list.hpp"

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
  // Rows of batch `step`: the batches read the data set epoch after epoch,
  // each epoch its rows in order, or with shuffle in a seeded per-epoch
  // permutation, less the rows the poison list leaves out of it.
  at::Tensor rows(int64_t step) const;
  // The run's poison list (format/poison_list.hpp): each epoch leaves out the
  // rows listed two steps or more before it starts. A function of the list
  // and the step alone, so a resumed run and every rank read alike. Throws
  // std::runtime_error when an epoch would have no row left.
  void leave_out(std::vector<format::PoisonedSample> list);
  // The data set rows the epoch holding `step`'s first row leaves out.
  std::vector<int64_t> left_out_at(int64_t step) const;

 private:
  // The epoch holding global position `position`, and its rows in order.
  struct Epoch {
    int64_t index = -1, first_position = 0;
    std::vector<int64_t> rows;
  };
  const Epoch& epoch_of(int64_t position) const;
  std::vector<int64_t> left_out_of(int64_t epoch_first_position) const;

  int64_t size_, batch_size_, rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  std::vector<format::PoisonedSample> left_out_;
  mutable Epoch epoch_;  // the latest epoch asked for: steps come in order
};

}  // namespace nanscope::trainer
