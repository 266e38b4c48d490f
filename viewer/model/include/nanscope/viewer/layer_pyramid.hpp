#pragma once
// A [step x layer] table (layer_grad_norm, layer_act_absmax) summarised at
// halving resolutions, so the heatmap reads a handful of cells per pixel
// whatever the zoom: level k holds one row per 2^k steps, each cell the largest
// value of its block. A NaN or Inf in a block survives into every level above.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nanscope::viewer {

class LayerPyramid {
 public:
  // nan_is_missing: NaN means "not recorded this step" and is skipped rather
  // than propagated (layer_act_absmax is recorded every N steps only).
  explicit LayerPyramid(bool nan_is_missing = false) : nan_is_missing_(nan_is_missing) {}

  // Takes the table after rows were appended (or first read): recomputes only
  // the blocks the new rows touch, and those from `first_changed_row` on (a
  // row that was rewritten: an overview's open block). `table` must stay
  // alive and unmoved until the next update (it is the level-0 data).
  void update(const std::vector<float>& table, size_t rows, size_t layers, size_t first_changed_row = SIZE_MAX);

  size_t layers() const { return layers_; }
  size_t rows() const { return rows_; }
  size_t levels() const { return coarse_.size() + 1; }
  size_t rows_at(size_t level) const;
  // The largest value of `layer` over rows [row_begin, row_end), read from the
  // coarsest level whose blocks are no longer than `rows_per_pixel`. Blocks at
  // the ends may reach slightly past the range: a heatmap pixel then shows its
  // neighbour's peak, never hides one. NaN when the range holds nothing.
  float max_over(size_t layer, size_t row_begin, size_t row_end, double rows_per_pixel) const;
  // The same for every layer at once (out: layers() values): one pass over
  // contiguous rows, the heatmap's inner loop.
  void max_over_all(size_t row_begin, size_t row_end, double rows_per_pixel, float* out) const;

  // The smallest and largest finite positive values seen (the colour scale).
  double finite_min() const { return finite_min_; }
  double finite_max() const { return finite_max_; }
  // Widens that range by `v` (finite and positive; others are ignored): a
  // pyramid over blocks' maxima learns the blocks' minima so.
  void note_finite(double v);
  bool nan_is_missing() const { return nan_is_missing_; }

  float combine(float a, float b) const;

 private:
  const float* level(size_t k) const { return k == 0 ? base_ : coarse_[k - 1].data(); }
  // The coarsest level whose blocks are no longer than rows_per_pixel, and its
  // blocks [begin, end) that cover rows [row_begin, row_end) (non-empty).
  struct Blocks {
    const float* data;
    size_t begin, end;
  };
  Blocks blocks_covering(size_t row_begin, size_t row_end, double rows_per_pixel) const;

  bool nan_is_missing_;
  const float* base_ = nullptr;
  size_t rows_ = 0, layers_ = 0;
  std::vector<std::vector<float>> coarse_;  // levels 1.., each [rows_at(k) x layers]
  double finite_min_ = 0, finite_max_ = 0;
};

// A pyramid placed on the step axis: row i spans steps [first_step[i],
// last_step[i]]. A run's rows (each one step), a window of them, or a long
// run's overview blocks (each 64 steps): the heatmap draws any of them alike.
struct LayerGrid {
  const LayerPyramid* pyramid = nullptr;
  const int64_t* first_step = nullptr;  // ascending, one per pyramid row
  const int64_t* last_step = nullptr;   // the same pointer for rows
  double steps_per_row = 1;             // 64 for the finest overview blocks
  bool empty() const { return !pyramid || pyramid->rows() == 0; }
};

// A pyramid over rows, one step each (`steps`: one per row).
inline LayerGrid rows_grid(const LayerPyramid& pyramid, const int64_t* steps) { return {&pyramid, steps, steps, 1}; }
}  // namespace nanscope::viewer
