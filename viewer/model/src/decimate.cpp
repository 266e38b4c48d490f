#include "nanscope/viewer/decimate.hpp"

#include <algorithm>
#include <cmath>

namespace nanscope::viewer {

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
    if (column.count == 0) {
      column.min = column.max = column.first = v;
    } else {
      column.min = std::min(column.min, v);
      column.max = std::max(column.max, v);
    }
    column.last = v;
    ++column.count;
  }
}

}  // namespace nanscope::viewer
