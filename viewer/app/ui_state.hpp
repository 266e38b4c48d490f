#pragma once
// What the person chose (zoom, selections, sort order) and the buffers the
// panels reuse from frame to frame, so a steady frame allocates nothing.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gl_texture.hpp"
#include "nanscope/viewer/axes.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/heatmap.hpp"
#include "nanscope/viewer/layer_table.hpp"

namespace nanscope::viewer {

// The step axis every plot shares: zooming one zooms all.
struct StepView {
  AxisRange x{0, 1};
  bool follow = true;  // show the whole run, growing as live rows arrive
};

struct PlotState {
  explicit PlotState(bool log = false) : log_y(log) {}
  bool log_y;
  bool auto_y = true;  // fit the visible data; off once the person pans or zooms y
  AxisRange y{0, 1};
  std::vector<std::vector<Column>> columns;  // per line, reused
  std::vector<float> points;                 // polyline scratch, x/y pairs
};

struct HeatmapState {
  HeatmapImage image;
  GlTexture texture;
  // What the image was built from; rebuilt when any of it changes (the scale
  // too: ranks side by side share one, widened by any rank's new rows).
  const void* source = nullptr;
  const LayerPyramid* pyramid = nullptr;  // rows, a window or blocks: which the view picked
  size_t revision = 0, columns = 0;
  AxisRange x{0, 0};
  LogScale scale;
};

// A screen rectangle a screenshot test inspects (printed with --screenshot).
struct Region {
  float x = 0, y = 0, w = 0, h = 0;
};

enum class Tab { training, snapshot };

struct UiState {
  StepView steps;
  PlotState loss{false}, loss_scale{true}, lr{false}, grad_norm{true};
  PlotState layer_norm{true}, act_absmax{true};
  // Per run index: the active run's heatmap, or each rank's of its group.
  // A map, not a vector: a GlTexture cannot move.
  std::map<size_t, HeatmapState> grad_heatmaps;
  size_t heatmap_columns = 1000;  // a heatmap pane's width: what a long run's rows are fetched for
  std::vector<bool> run_visible;
  int active_run = 0;       // the run whose layers the heatmap and table show
  int selected_layer = -1;  // plotted below the heatmap
  int selected_snapshot = -1;
  // The snapshot whose precision trail was scrolled to its lost op (once, so
  // the user's own scrolling stays): its path.
  std::string trail_scrolled_for;
  Tab tab = Tab::training;
  bool select_tab = true;    // apply `tab` to the tab bar on the next frame
  size_t layer_window = 50;  // K of "growth over the last K steps"
  std::vector<LayerRow> layer_rows;
  size_t layer_rows_built_for = SIZE_MAX;  // row count the table was computed at
  int layer_sort_column = 1;
  bool layer_sort_descending = true;
  std::map<std::string, Region> regions;
};

}  // namespace nanscope::viewer
