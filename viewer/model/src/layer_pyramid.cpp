#include "nanscope/viewer/layer_pyramid.hpp"

#include "nanscope/format/bulk_buffer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nanscope::viewer {

float LayerPyramid::combine(float a, float b) const {
  if (std::isnan(a)) return nan_is_missing_ ? b : a;
  if (std::isnan(b)) return nan_is_missing_ ? a : b;
  return std::max(a, b);
}

void LayerPyramid::note_finite(double v) {
  if (!std::isfinite(v) || v <= 0) return;
  if (finite_max_ == 0) {
    finite_min_ = finite_max_ = v;
  } else {
    finite_min_ = std::min(finite_min_, v);
    finite_max_ = std::max(finite_max_, v);
  }
}

size_t LayerPyramid::rows_at(size_t k) const { return (rows_ + (size_t(1) << k) - 1) >> k; }

void LayerPyramid::update(const std::vector<float>& table, size_t rows, size_t layers, size_t first_changed_row) {
  if (layers != layers_ || rows < rows_) {  // a different table: start over
    coarse_.clear();
    rows_ = 0;
    finite_min_ = finite_max_ = 0;
  }
  const size_t old_rows = std::min(rows_, first_changed_row);
  base_ = table.data();
  layers_ = layers;
  rows_ = layers == 0 ? 0 : std::min(rows, table.size() / layers);
  if (rows_ == 0) return;

  for (size_t i = old_rows * layers_; i < rows_ * layers_; ++i) note_finite(base_[i]);

  // Level k row i combines level k-1 rows 2i and 2i+1; only rows from the
  // block holding the first new row onwards change.
  size_t k = 1;
  for (; rows_at(k - 1) > 1; ++k) {
    if (coarse_.size() < k) coarse_.emplace_back();
    std::vector<float>& out = coarse_[k - 1];
    const size_t below_rows = rows_at(k - 1);
    const size_t n = rows_at(k);
    const size_t first = (old_rows >> k);
    // Room for a followed run to double: its new rows never move a level.
    if (out.capacity() < n * layers_) format::reserve_bulk(out, 2 * n * layers_);
    format::resize_bulk(out, n * layers_);
    const float* below = level(k - 1);
    for (size_t i = first; i < n; ++i) {
      const float* a = below + (2 * i) * layers_;
      float* o = out.data() + i * layers_;
      if (2 * i + 1 < below_rows) {
        const float* b = a + layers_;
        for (size_t l = 0; l < layers_; ++l) o[l] = combine(a[l], b[l]);
      } else {
        std::copy(a, a + layers_, o);
      }
    }
  }
  coarse_.resize(k - 1);
}

LayerPyramid::Blocks LayerPyramid::blocks_covering(size_t row_begin, size_t row_end, double rows_per_pixel) const {
  size_t k = 0;
  while (k + 1 < levels() && double(size_t(1) << (k + 1)) <= rows_per_pixel) ++k;
  return {level(k), row_begin >> k, std::min(rows_at(k), ((row_end - 1) >> k) + 1)};
}

float LayerPyramid::max_over(size_t layer, size_t row_begin, size_t row_end, double rows_per_pixel) const {
  row_end = std::min(row_end, rows_);
  if (layer >= layers_ || row_begin >= row_end) return std::numeric_limits<float>::quiet_NaN();
  const auto [data, begin, end] = blocks_covering(row_begin, row_end, rows_per_pixel);
  float best = data[begin * layers_ + layer];
  for (size_t i = begin + 1; i < end; ++i) best = combine(best, data[i * layers_ + layer]);
  return best;
}

void LayerPyramid::max_over_all(size_t row_begin, size_t row_end, double rows_per_pixel, float* out) const {
  row_end = std::min(row_end, rows_);
  if (row_begin >= row_end) {
    std::fill(out, out + layers_, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const auto [data, begin, end] = blocks_covering(row_begin, row_end, rows_per_pixel);
  std::copy(data + begin * layers_, data + (begin + 1) * layers_, out);
  for (size_t i = begin + 1; i < end; ++i) {
    const float* row = data + i * layers_;
    for (size_t l = 0; l < layers_; ++l) out[l] = combine(out[l], row[l]);
  }
}

}  // namespace nanscope::viewer
