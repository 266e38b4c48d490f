#pragma once
// Min/max decimation: many steps per pixel column, drawn as one vertical span
// per column. Non-finite values are never averaged away: a column that holds a
// NaN or an Inf says so, however far the view is zoomed out.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "nanscope/format/run_overview.hpp"

namespace nanscope::viewer {

enum NonFinite : uint8_t { kNaN = 1, kPosInf = 2, kNegInf = 4 };

// What one pixel column holds: the finite values' extent, the first and last
// finite value (to join neighbouring columns), and which non-finite kinds occur.
struct Column {
  double min = 0, max = 0, first = 0, last = 0;
  int32_t count = 0;      // finite values
  uint8_t nonfinite = 0;  // NonFinite bits
  bool empty() const { return count == 0 && nonfinite == 0; }
};

// One series as stored in RunData: value i at data[i * stride] (stride is the
// layer count for one layer's column of a [step x layer] table).
struct SeriesView {
  const double* f64 = nullptr;
  const float* f32 = nullptr;
  size_t count = 0;
  size_t stride = 1;
  double operator[](size_t i) const { return f64 ? f64[i * stride] : double(f32[i * stride]); }
};

inline SeriesView series(const std::vector<double>& v) { return {v.data(), nullptr, v.size(), 1}; }
// Column `layer` of a row-major [rows x layers] table.
inline SeriesView layer_series(const std::vector<float>& table, size_t layers, size_t layer) {
  if (layers == 0 || table.empty()) return {};
  return {nullptr, table.data() + layer, table.size() / layers, layers};
}

struct DecimateOptions {
  bool nan_is_missing = false;        // NaN means "not recorded" (layer_act_absmax), not a fault
  bool log_y = false;                 // values <= 0 have no place on a log axis: skipped
  const uint8_t* left_out = nullptr;  // per row, 1: no point of the curve (a non-finite value is still marked)
};

// Bins the points whose step lies in [x0, x1) into `columns` equal columns.
// `steps` is ascending. `out` is resized to `columns` and overwritten; its
// capacity is kept, so a frame that reuses it allocates nothing.
void decimate(const int64_t* steps, SeriesView values, double x0, double x1, size_t columns, std::vector<Column>& out,
              DecimateOptions options = {});

// One series of a run's overview (format/run_overview.hpp): a scalar, or one
// layer of a per-layer table.
enum class OverviewTable : uint8_t { scalars, layer_grad_norm, layer_act_absmax };
struct BlockSeries {
  const format::RunOverview* overview = nullptr;  // null: the series has rows only
  OverviewTable table = OverviewTable::scalars;
  size_t column = 0;  // the scalar (format::OverviewScalar) or the layer
};

// Bins the blocks of `level` that reach into [x0, x1) into `columns` equal
// columns, like decimate: a block counts in every column it reaches, with
// its min and max, its last value, and its NaNs and Infs as marks (a block
// keeps no sign of its Infs: they are marked +Inf). A block's rows are all
// in it, skipped and rolled-back ones too: a spike anywhere shows.
void decimate_blocks(const format::OverviewLevel& level, const BlockSeries& series, double x0, double x1,
                     size_t columns, std::vector<Column>& out, DecimateOptions options = {});

// Rows stepped by `steps` (`count` of them, ascending) hold every step of
// [x0, x1) that the run holds (its steps are [run_first, run_last]).
bool rows_span_view(const int64_t* steps, size_t count, double x0, double x1, double run_first, double run_last);

// A series at any zoom: from the coarsest overview level whose blocks fit in
// a pixel column; else from `rows` (stepped by `steps`) where they span the
// view; else from the finest blocks (a window of rows not fetched yet).
void decimate_series(const int64_t* steps, SeriesView rows, const BlockSeries& blocks, double x0, double x1,
                     size_t columns, std::vector<Column>& out, DecimateOptions options = {});

// The first index whose step is >= x (binary search over ascending steps).
size_t first_at_or_after(const int64_t* steps, size_t count, double x);

}  // namespace nanscope::viewer
