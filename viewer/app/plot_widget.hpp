#pragma once
// The project's own plot (ImPlot is not packaged): decimated lines drawn on
// ImDrawList over a shared step axis, non-finite markers that survive any
// zoom, event markers with tooltips, horizontal reference lines.
// Mouse: wheel zooms steps, shift+wheel zooms y, drag pans, double-click fits.
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "ui_state.hpp"

namespace nanscope::viewer {

struct PlotLine {
  const char* label = "";
  const int64_t* steps = nullptr;
  SeriesView values;
  uint32_t color = 0;
  bool nan_is_missing = false;
  const uint8_t* left_out = nullptr;  // per row, 1: a rolled-back step, drawn as no part of the curve
  BlockSeries blocks;                 // a long run's overview of the same series (decimate_series)
};

struct ReferenceLine {
  double value = 0;
  uint32_t color = 0;
  const char* label = "";
};

struct PlotSpec {
  const char* title = "";
  std::vector<PlotLine> lines;
  std::vector<const std::vector<format::RunEvent>*> markers;  // vertical lines, tooltip = text
  std::vector<ReferenceLine> references;
  bool allow_log = true;
  void clear() {  // keeps capacity: specs are rebuilt every frame
    lines.clear();
    markers.clear();
    references.clear();
  }
};

// Draws one plot filling `width` x `height` at the cursor. Returns the plot
// area's rectangle (for screenshots' regions).
Region draw_plot(const PlotSpec& spec, float width, float height, StepView& steps, AxisRange step_extent,
                 PlotState& state);

// The colour an event kind is drawn in.
uint32_t event_color(format::EventKind kind);

}  // namespace nanscope::viewer
