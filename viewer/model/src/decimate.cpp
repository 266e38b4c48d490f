#include "nanscope/viewer/decimate.hpp"

#include <algorithm>
#include <cmath>

namespace nanscope::viewer {

namespace {

// A finite value into a column's extent.
void add_value(Column& column, double v) {
  if (column.count == 0) {
    column.min = column.max = column.first = v;
  } else {
    column.min = std::min(column.min, v);
    column.max = std::max(column.max, v);
  }
  column.last = v;
  ++column.count;
}

}  // namespace

size_t first_at_or_after(const int64_t* steps, size_t count, double x) {
  return size_t(
      std::lower_bound(steps, steps + count, x, [](int64_t step, double value) { return double(step) < value; }) -
      steps);
}

void decimate(const int64_t* steps, SeriesView values, double x0, double x1, size_t columns, std::vector<Column>& out,
              DecimateOptions options) {
  out.assign(columns, Column{});
  if (columns == 0 || !(x1 > x0) || values.count == 0) return;
  const double per_column = double(columns) / (x1 - x0);
  for (size_t i = first_at_or_after(steps, values.count, x0); i < values.count; ++i) {
    const double x = double(steps[i]);
    if (x >= x1) break;
    const size_t c = std::min(columns - 1, size_t((x - x0) * per_column));
    Column& column = out[c];
    const double v = values[i];
    if (std::isnan(v)) {
      if (!options.nan_is_missing) column.nonfinite |= kNaN;
      continue;
    }
    if (std::isinf(v)) {
      column.nonfinite |= v > 0 ? kPosInf : kNegInf;
      continue;
    }
    if (options.left_out && options.left_out[i]) continue;  // marked when non-finite, never on the curve
    if (options.log_y && v <= 0) continue;
    add_value(column, v);
  }
}

namespace {

template <typename T>
void bin_blocks(const format::OverviewLevel& level, const format::BlockStats<T>& stats, size_t series, double x0,
                double x1, std::vector<Column>& out, const DecimateOptions& options) {
  const size_t n = level.blocks(), columns = out.size(), width = stats.width;
  if (series >= width) return;
  const double per_column = double(columns) / (x1 - x0);
  auto column_of = [&](double x) { return size_t(std::clamp((x - x0) * per_column, 0.0, double(columns - 1))); };
  // Block i covers steps [first_step[i], last_step[i] + 1).
  for (size_t i = first_at_or_after(level.last_step.data(), n, std::nextafter(x0 - 1, x1)); i < n; ++i) {
    if (double(level.first_step[i]) >= x1) break;
    const size_t at = i * width + series;
    const double lo = stats.min[at], hi = stats.max[at], last = stats.last[at];
    const uint8_t marks =
        uint8_t((stats.nan[at] > 0 && !options.nan_is_missing ? kNaN : 0) | (stats.inf[at] > 0 ? kPosInf : 0));
    const bool finite = !std::isnan(lo) && !(options.log_y && hi <= 0);
    const size_t c_end = column_of(std::nextafter(double(level.last_step[i]) + 1, x0));
    for (size_t c = column_of(double(level.first_step[i])); c <= c_end; ++c) {
      Column& column = out[c];
      column.nonfinite |= marks;
      if (!finite) continue;
      const double low = options.log_y && lo <= 0 ? hi : lo;
      if (column.count == 0) column.first = std::isfinite(last) ? last : low;
      add_value(column, low);
      add_value(column, hi);
      if (std::isfinite(last) && !(options.log_y && last <= 0)) column.last = last;
    }
  }
}

}  // namespace

void decimate_blocks(const format::OverviewLevel& level, const BlockSeries& series, double x0, double x1,
                     size_t columns, std::vector<Column>& out, DecimateOptions options) {
  out.assign(columns, Column{});
  if (columns == 0 || !(x1 > x0)) return;
  switch (series.table) {
    case OverviewTable::scalars: bin_blocks(level, level.scalars, series.column, x0, x1, out, options); break;
    case OverviewTable::layer_grad_norm:
      bin_blocks(level, level.layer_grad_norm, series.column, x0, x1, out, options);
      break;
    case OverviewTable::layer_act_absmax:
      bin_blocks(level, level.layer_act_absmax, series.column, x0, x1, out, options);
      break;
  }
}

bool rows_span_view(const int64_t* steps, size_t count, double x0, double x1, double run_first, double run_last) {
  return count > 0 && double(steps[0]) <= std::max(x0, run_first) &&
         double(steps[count - 1]) >= std::min(std::ceil(x1) - 1, run_last);
}

void decimate_series(const int64_t* steps, SeriesView rows, const BlockSeries& blocks, double x0, double x1,
                     size_t columns, std::vector<Column>& out, DecimateOptions options) {
  const format::RunOverview* overview = blocks.overview;
  if (!overview || overview->levels.empty() || overview->levels[0].blocks() == 0 || columns == 0) {
    decimate(steps, rows, x0, x1, columns, out, options);
    return;
  }
  const double rows_per_pixel = (x1 - x0) / double(columns);  // a run's steps are consecutive rows
  const format::OverviewLevel* level = nullptr;
  for (const format::OverviewLevel& l : overview->levels)
    if (double(l.block_rows) <= rows_per_pixel && l.blocks() > 0) level = &l;
  if (!level) {
    const format::OverviewLevel& finest = overview->levels[0];
    const double run_first = double(finest.first_step.front()), run_last = double(finest.last_step.back());
    if (rows_span_view(steps, rows.count, x0, x1, run_first, run_last)) {
      decimate(steps, rows, x0, x1, columns, out, options);
      return;
    }
    level = &finest;
  }
  decimate_blocks(*level, blocks, x0, x1, columns, out, options);
}

}  // namespace nanscope::viewer
