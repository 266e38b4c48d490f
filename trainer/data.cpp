#include "nanscope/trainer/data.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "nanscope/format/data_file.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope::trainer {

using probe::tensor_from_data;

Dataset load_dataset(const std::string& path) {
  format::DataFile file = format::read_data_file(path);
  return {tensor_from_data(file.inputs), tensor_from_data(file.targets), path};
}

Dataset builtin_text_dataset(int64_t seq_len) {
  const char* path = "/usr/share/common-licenses/GPL-3";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string("built-in text '") + path + "' not found; pass --data");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const int64_t windows = (int64_t(text.size()) - 1) / seq_len;
  if (windows < 1) throw std::runtime_error("built-in text is shorter than --seq-len");
  at::Tensor bytes = at::empty({int64_t(text.size())}, at::kLong);
  auto* b = bytes.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) b[i] = static_cast<unsigned char>(text[i]);
  at::Tensor starts = at::arange(windows, at::kLong) * seq_len;
  at::Tensor offsets = at::arange(seq_len, at::kLong);
  at::Tensor index = starts.unsqueeze(1) + offsets.unsqueeze(0);
  return {bytes.index_select(0, index.reshape({-1})).reshape({windows, seq_len}),
          bytes.index_select(0, (index + 1).reshape({-1})).reshape({windows, seq_len}),
          std::string("built-in text ") + path};
}

Dataset builtin_teacher_dataset(int64_t samples, int64_t features, int64_t classes, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor x = at::normal(0.0, 1.0, {samples, features}, gen);
  at::Tensor w = at::normal(0.0, 1.0, {features, classes}, gen);
  at::Tensor y = at::matmul(x, w).argmax(1);
  return {x, y, "built-in teacher task (seed " + std::to_string(seed) + ")"};
}

BatchSampler::BatchSampler(int64_t dataset_size, int64_t batch_size, bool shuffle, uint64_t seed, int rank,
                           int world_size)
    : size_(dataset_size),
      batch_size_(batch_size),
      rank_(rank),
      world_size_(world_size),
      shuffle_(shuffle),
      seed_(seed) {
  if (size_ < 1) throw std::invalid_argument("dataset is empty");
}

at::Tensor BatchSampler::rows(int64_t step) const {
  at::Tensor out = at::empty({batch_size_}, at::kLong);
  auto* r = out.data_ptr<int64_t>();
  std::vector<int64_t> permutation;
  int64_t permutation_epoch = -1;
  for (int64_t j = 0; j < batch_size_; ++j) {
    const int64_t position = (step * world_size_ + rank_) * batch_size_ + j;
    const int64_t within = position % size_;
    if (!shuffle_) {
      r[j] = within;
      continue;
    }
    const int64_t epoch = position / size_;
    if (epoch != permutation_epoch) {
      permutation.resize(size_);
      std::iota(permutation.begin(), permutation.end(), 0);
      std::mt19937_64 rng(seed_ * 1000003ULL + uint64_t(epoch));
      std::shuffle(permutation.begin(), permutation.end(), rng);
      permutation_epoch = epoch;
    }
    r[j] = permutation[within];
  }
  return out;
}

}  // namespace nanscope::trainer
