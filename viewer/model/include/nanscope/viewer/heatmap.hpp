#pragma once
// The layer x step heatmap as an image: one pixel column per screen column,
// one row per layer, each pixel the largest value of its layer over the steps
// the column covers (read from a LayerPyramid).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nanscope/viewer/colormap.hpp"
#include "nanscope/viewer/layer_pyramid.hpp"

namespace nanscope::viewer {

struct HeatmapImage {
  size_t columns = 0, rows = 0;  // rows: one per layer, top to bottom
  std::vector<float> value;      // [rows x columns], for hover read-outs
  std::vector<uint32_t> rgba;    // [rows x columns], the texture
  std::vector<float> column;     // scratch: one pixel column, all layers
  float at(size_t row, size_t column) const { return value[row * columns + column]; }
};

// Fills `image` for steps in [x0, x1) over `columns` pixel columns from
// `grid` (a run's rows, or a long run's overview blocks: a block that
// reaches into a column counts in it whole). Buffers are reused: a frame that
// redraws at the same size allocates nothing.
void render_heatmap(const LayerGrid& grid, double x0, double x1, size_t columns, const LogScale& scale,
                    HeatmapImage& image);

}  // namespace nanscope::viewer
