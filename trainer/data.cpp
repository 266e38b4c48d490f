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

void BatchSampler::leave_out(std::vector<format::PoisonedSample> list) {
  left_out_ = std::move(list);
  epoch_ = Epoch{};
}

std::vector<int64_t> BatchSampler::left_out_of(int64_t epoch_first_position) const {
  // The step that reads an epoch's first row is when it starts.
  std::vector<int64_t> rows = format::rows_left_out_at(left_out_, epoch_first_position / (world_size_ * batch_size_));
  rows.erase(std::remove_if(rows.begin(), rows.end(), [&](int64_t row) { return row >= size_; }), rows.end());
  return rows;  // a list from another data set may name rows past this one's
}

std::vector<int64_t> BatchSampler::left_out_at(int64_t step) const {
  return left_out_of(epoch_of((step * world_size_ + rank_) * batch_size_).first_position);
}

const BatchSampler::Epoch& BatchSampler::epoch_of(int64_t position) const {
  if (epoch_.index >= 0 && position >= epoch_.first_position &&
      position < epoch_.first_position + int64_t(epoch_.rows.size()))
    return epoch_;
  // Each epoch is the data set less the rows left out of it: walk the
  // epochs' lengths from the start (no list: every epoch is the data set).
  int64_t index = 0, first = 0, length = size_;
  if (left_out_.empty()) {
    index = position / size_;
    first = index * size_;
  } else {
    for (;; ++index, first += length) {
      length = size_ - int64_t(left_out_of(first).size());
      if (length <= 0)
        throw std::runtime_error("every row of the data set is in the run's poison list (" +
                                 std::string(format::kPoisonListFile) + "): no epoch is left to read");
      if (position < first + length) break;
    }
  }
  std::vector<int64_t> rows(size_t(size_), 0);
  std::iota(rows.begin(), rows.end(), 0);
  if (shuffle_) {
    std::mt19937_64 rng(seed_ * 1000003ULL + uint64_t(index));
    std::shuffle(rows.begin(), rows.end(), rng);
  }
  if (!left_out_.empty()) {
    const std::vector<int64_t> out = left_out_of(first);
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](int64_t row) { return std::binary_search(out.begin(), out.end(), row); }),
               rows.end());
  }
  epoch_ = Epoch{index, first, std::move(rows)};
  return epoch_;
}

at::Tensor BatchSampler::rows(int64_t step) const {
  at::Tensor out = at::empty({batch_size_}, at::kLong);
  auto* r = out.data_ptr<int64_t>();
  for (int64_t j = 0; j < batch_size_; ++j) {
    const int64_t position = (step * world_size_ + rank_) * batch_size_ + j;
    const Epoch& epoch = epoch_of(position);
    r[j] = epoch.rows[size_t(position - epoch.first_position)];
  }
  return out;
}

}  // namespace nanscope::trainer
