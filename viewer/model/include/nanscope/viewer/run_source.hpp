#pragma once
// One run file in the viewer: its rows (followed while the run is written),
// the pyramids the heatmaps read, and the error that stopped it, if any. A run
// that goes bad while followed keeps every row read before.
//
// A short run's rows are all in memory. A long one (more than kLongRunRows
// rows, or per-layer tables past kLongRunLayerValues values) keeps its scalar
// rows only; its per-layer tables are read through its overview
// (OverviewLayers), and the plots of every series draw from the overview's
// blocks wherever a pixel column spans a block or more.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "nanscope/viewer/axes.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/layer_pyramid.hpp"
#include "nanscope/viewer/overview_layers.hpp"

namespace nanscope::viewer {

// Past these a run is long (see above): decimating a million rows per series
// per frame, or holding 2 GB of per-layer values, is what they avoid.
inline constexpr size_t kLongRunRows = 65536;
inline constexpr size_t kLongRunLayerValues = size_t(1) << 22;
// The most rows a zoomed-in view fetches of a long run's per-layer tables.
inline constexpr size_t kWindowRows = 16384;

class RunSource {
 public:
  // Called while a long run written before format 1.12 (no overview) has one
  // built from its rows: rows done, rows.
  using OverviewProgress = std::function<void(int64_t, int64_t)>;

  // Never throws: a file that cannot be read keeps its message in error().
  // `rank`: which process of a multi-process run wrote it (-1: a one-process
  // run, or a file opened on its own).
  explicit RunSource(const std::string& path, int rank = -1, const OverviewProgress& progress = nullptr);
  RunSource(RunSource&&) noexcept;
  RunSource& operator=(RunSource&&) noexcept;
  ~RunSource();

  const std::string& path() const { return path_; }
  // The run directory's name (or the file's), for legends; "DIR rank R" for a rank.
  const std::string& label() const { return label_; }
  int rank() const { return rank_; }
  const std::string& error() const { return error_; }
  bool has_data() const { return follower_ != nullptr; }
  const format::RunData& data() const;

  // Reads rows appended since the last poll and extends the pyramids; returns
  // how many. A read error stops following and sets error().
  size_t poll();
  bool following() const { return following_; }
  // Counts the polls that changed what is drawn (new rows, a window of rows
  // fetched): a cached image is stale when it differs.
  size_t revision() const { return revision_; }
  // Rows that arrived after the file was opened: the run is live.
  size_t rows_since_open() const { return data().rows() - rows_at_open_; }

  // A short run's grad norms over its rows, the heatmap's (empty for a long run).
  const LayerPyramid& grad_norms() const { return grad_norms_; }
  // A long run's overview (null for a short one).
  const format::RunOverview* overview() const { return long_ ? &long_->overview() : nullptr; }
  bool is_long() const { return long_ != nullptr; }
  // What the heatmap draws of the grad norms for steps `view` over `columns`
  // pixel columns: the rows (a short run's, or a long run's window when it
  // spans the view and a pixel holds less than a block), else the blocks.
  LayerGrid grad_norm_grid(AxisRange view, size_t columns) const;
  // The rows a layer plot draws (a short run's all, a long run's window) and
  // their steps; and the same series' blocks (BlockSeries::overview null for
  // a short run).
  SeriesView layer_rows(OverviewTable table, size_t layer) const;
  const int64_t* layer_row_steps() const;
  // off_curve() for those rows.
  const uint8_t* layer_rows_off_curve() const;
  BlockSeries layer_blocks(OverviewTable table, size_t layer) const;
  BlockSeries scalar_blocks(format::OverviewScalar scalar) const;
  // The smallest and largest finite positive grad norm (the heatmap's scale).
  double grad_norm_min() const;
  double grad_norm_max() const;
  bool has_layer_table(OverviewTable table) const;
  // A long run: starts fetching the rows of the view when it is narrow
  // enough to show them (behind the frames; poll() takes them).
  void focus(AxisRange view, size_t columns);
  // The error of a window fetch that failed, once ("" otherwise): the view
  // then stays on the blocks.
  std::string take_window_error();
  // Steps [first, last]; {0, 1} for an empty run.
  AxisRange step_extent() const;
  // The first step whose loss or global grad norm is not finite; -1 if none.
  int64_t first_nonfinite_step() const { return first_nonfinite_step_; }
  // Some step ran in fp16: only fp16 has a loss scaler (playbook P5, P6). A
  // bf16 or fp32 run records a loss scale of 1 on every row, a flat line that
  // says nothing, so the loss-scale plot leaves it out.
  bool has_loss_scaler() const { return has_loss_scaler_; }
  // Per row, 1 where a rollback took the step back (format::rolled_back_rows).
  const std::vector<uint8_t>& rolled_back() const { return rolled_back_; }
  // Per row, 1 for the rows that are no point of the run's curves: rolled
  // back, or skipped (the update never reached the weights; a finite loss
  // there is a spike skipped on probation or an fp16 overflow).
  const std::vector<uint8_t>& off_curve() const { return off_curve_; }
  // The warning, rollback, remedy, save_refused, doom and stop events, in file order: what the sidebar lists.
  const std::vector<format::RunEvent>& sentinel_events() const { return sentinel_events_; }

 private:
  void absorb_new_rows(size_t from);
  void absorb_events();
  void absorb_rows_without_events(size_t from);
  // Reopens the rows without their per-layer tables and reads those through
  // the overview: at open for a long run, or when a followed run grows long.
  void become_long();
  bool long_enough() const;

  std::string path_, label_, error_;
  int rank_ = -1;
  std::unique_ptr<format::RunFollower> follower_;
  std::unique_ptr<OverviewLayers> long_;
  std::string window_error_;
  size_t revision_ = 0;
  bool following_ = false;
  size_t rows_at_open_ = 0;
  LayerPyramid grad_norms_{false};
  int64_t first_nonfinite_step_ = -1;
  bool has_loss_scaler_ = false;
  std::vector<uint8_t> rolled_back_, off_curve_;
  std::vector<format::RunEvent> sentinel_events_;
  size_t events_seen_ = 0;
};

}  // namespace nanscope::viewer
