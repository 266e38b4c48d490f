#include "nanscope/viewer/axes.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace nanscope::viewer {

AxisRange zoomed(AxisRange range, double anchor, double factor) {
  return {anchor - (anchor - range.lo) * factor, anchor + (range.hi - anchor) * factor};
}

AxisRange clamped(AxisRange range, AxisRange extent, double min_span) {
  double span = std::clamp(range.span(), min_span, std::max(min_span, extent.span()));
  double lo = range.lo;
  if (range.span() != span) lo = 0.5 * (range.lo + range.hi) - 0.5 * span;
  lo = std::clamp(lo, extent.lo, std::max(extent.lo, extent.hi - span));
  return {lo, lo + span};
}

AxisRange padded(AxisRange range, double fraction) {
  if (!(range.span() > 0)) {
    const double half = range.lo != 0 ? std::abs(range.lo) * 0.5 : 0.5;
    return {range.lo - half, range.hi + half};
  }
  const double pad = range.span() * fraction;
  return {range.lo - pad, range.hi + pad};
}

AxisRange including(AxisRange range, double value) {
  if (!std::isfinite(value)) return range;
  return {std::min(range.lo, value), std::max(range.hi, value)};
}

AxisRange fit_columns(const std::vector<Column>& columns, bool log_y, AxisRange fallback) {
  bool any = false;
  AxisRange range{0, 0};
  for (const Column& c : columns) {
    if (c.count == 0) continue;
    const double lo = log_y ? std::log10(c.min) : c.min;
    const double hi = log_y ? std::log10(c.max) : c.max;
    if (!any) range = {lo, hi};
    range = {std::min(range.lo, lo), std::max(range.hi, hi)};
    any = true;
  }
  return any ? padded(range, 0.05) : fallback;
}

void linear_ticks(AxisRange range, int max_ticks, std::vector<double>& out) {
  out.clear();
  if (!(range.span() > 0) || max_ticks < 1 || !std::isfinite(range.span())) return;
  const double rough = range.span() / max_ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= rough) break;
  }
  for (double t = std::ceil(range.lo / step) * step; t <= range.hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
}

void log_ticks(AxisRange log_range, int max_ticks, std::vector<double>& out) {
  out.clear();
  if (!(log_range.span() > 0) || max_ticks < 1 || !std::isfinite(log_range.span())) return;
  if (log_range.span() < 2) {  // under two decades: 1, 2, 5 in each
    for (double d = std::floor(log_range.lo); d <= log_range.hi; ++d)
      for (double m : {1.0, 2.0, 5.0})
        if (log_range.contains(d + std::log10(m))) out.push_back(d + std::log10(m));
    return;
  }
  const double every = std::max(1.0, std::ceil(log_range.span() / max_ticks));
  for (double d = std::ceil(log_range.lo / every) * every; d <= log_range.hi; d += every) out.push_back(d);
}

void format_value(double value, char* buffer, size_t size) {
  if (std::isnan(value)) {
    std::snprintf(buffer, size, "nan");
  } else if (std::isinf(value)) {
    std::snprintf(buffer, size, value > 0 ? "inf" : "-inf");
  } else if (value != 0 && (std::abs(value) < 1e-3 || std::abs(value) >= 1e6)) {
    std::snprintf(buffer, size, "%.2g", value);
  } else {
    std::snprintf(buffer, size, "%.4g", value);
  }
}

}  // namespace nanscope::viewer
