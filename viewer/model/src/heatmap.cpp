#include "nanscope/viewer/heatmap.hpp"

#include <cmath>
#include <limits>

#include "nanscope/viewer/decimate.hpp"

namespace nanscope::viewer {

void render_heatmap(const LayerGrid& grid, double x0, double x1, size_t columns, const LogScale& scale,
                    HeatmapImage& image) {
  static const LayerPyramid none;
  const LayerPyramid& pyramid = grid.pyramid ? *grid.pyramid : none;
  const size_t layers = pyramid.layers();
  const size_t rows = pyramid.rows();
  image.columns = columns;
  image.rows = layers;
  image.value.assign(columns * layers, std::numeric_limits<float>::quiet_NaN());
  image.rgba.assign(columns * layers, kMissingColor);
  if (columns == 0 || layers == 0 || rows == 0 || !(x1 > x0)) return;
  const double step_width = (x1 - x0) / double(columns);
  const double rows_per_pixel = step_width / grid.steps_per_row;
  const HeatColorizer color(scale, pyramid.nan_is_missing());
  // Row i covers steps [first_step[i], last_step[i] + 1): zoomed in, one
  // step fills several pixel columns.
  for (size_t c = 0; c < columns; ++c) {
    const double a = x0 + double(c) * step_width, b = a + step_width;
    const size_t row_begin = first_at_or_after(grid.last_step, rows, std::nextafter(a - 1, b));
    const size_t row_end = first_at_or_after(grid.first_step, rows, b);
    if (row_end > row_begin) {
      image.column.resize(layers);
      pyramid.max_over_all(row_begin, row_end, rows_per_pixel, image.column.data());
      for (size_t l = 0; l < layers; ++l) {
        const float v = image.column[l];
        image.value[l * columns + c] = v;
        image.rgba[l * columns + c] = color(v);
      }
    }
  }
}

}  // namespace nanscope::viewer
