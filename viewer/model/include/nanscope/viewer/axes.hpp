#pragma once
// Axis arithmetic for the plot widget, kept free of ImGui so zoom, pan, fit
// and tick placement are unit-tested.
#include <cstddef>
#include <vector>

#include "nanscope/viewer/decimate.hpp"

namespace nanscope::viewer {

struct AxisRange {
  double lo = 0, hi = 1;
  double span() const { return hi - lo; }
  bool contains(double v) const { return v >= lo && v <= hi; }
};

// Zooms by `factor` (< 1 zooms in) keeping `anchor` where it is on screen.
AxisRange zoomed(AxisRange range, double anchor, double factor);
// Keeps a step range within [lo, hi] of the data and at least `min_span` wide.
AxisRange clamped(AxisRange range, AxisRange extent, double min_span);

// The extent of decimated columns' finite values (log10 of them for a log
// axis), padded by 5%; `fallback` when nothing finite is in view.
AxisRange fit_columns(const std::vector<Column>& columns, bool log_y, AxisRange fallback);
// Grows `range` to include `value` (already in axis units).
AxisRange including(AxisRange range, double value);
// Pads a range by a fraction of its span on both ends; widens a flat one.
AxisRange padded(AxisRange range, double fraction);

// Tick positions at 1-2-5 x 10^k steps, at most about `max_ticks` of them.
void linear_ticks(AxisRange range, int max_ticks, std::vector<double>& out);
// For an axis in log10 units: ticks at whole decades (every n-th when crowded),
// and at 1, 2 and 5 within each decade when the axis spans less than two.
void log_ticks(AxisRange log_range, int max_ticks, std::vector<double>& out);

// A short label for a tick or a read-out value ("1.5e-04", "2000", "nan").
void format_value(double value, char* buffer, size_t size);

}  // namespace nanscope::viewer
