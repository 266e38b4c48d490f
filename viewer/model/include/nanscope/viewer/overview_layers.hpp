#pragma once
// A long run's per-layer tables as the screen reads them: never the rows
// whole (a million steps of 256 layers is 2 GB), but the run's overview
// (blocks of 64 steps and up, each layer's min, max and NaN/Inf counts:
// format::OverviewFollower) as pyramids, plus the window of rows the view is
// zoomed into, fetched behind the frames by a child process
// (format::LayerRowsFetch). A NaN anywhere in a block shows in that block.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/layer_rows_fetch.hpp"
#include "nanscope/format/overview_follower.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/layer_pyramid.hpp"

namespace nanscope::viewer {

class OverviewLayers {
 public:
  // `follower`: the run's overview, opened (format::OverviewFollower throws
  // FormatError naming the file).
  OverviewLayers(const std::string& path, size_t layers, std::unique_ptr<format::OverviewFollower> follower);
  ~OverviewLayers();

  // Folds in the rows written since; true when there were any.
  bool refresh();
  const format::RunOverview& overview() const { return follower_->overview(); }

  // The grad norms (the heatmap's table) over the finest blocks, one
  // pyramid row per 64 steps; and over the fetched window's rows (empty
  // without one).
  LayerGrid grad_norm_blocks() const;
  LayerGrid grad_norm_window() const;
  const format::LayerRows& window_rows() const { return window_; }
  // The window's rows of `layer` in `table` (count 0 without one).
  SeriesView window_series(OverviewTable table, size_t layer) const;

  // Starts fetching rows [from, to) unless the window holds them or a fetch
  // is running. Once a fetch has failed, none starts again.
  void want_rows(size_t from, size_t to);
  // A fetch that finished: its rows become the window (true). Throws
  // FormatError for one that failed.
  bool take_fetched();

 private:
  void rebuild_blocks(size_t first_changed_block);

  std::string path_;
  size_t layers_;
  std::unique_ptr<format::OverviewFollower> follower_;
  // The finest level's blocks as pyramid rows: a block's largest value, or
  // NaN/Inf when it held one (its colour wins at every zoom).
  std::vector<float> grad_blocks_;
  LayerPyramid grad_blocks_pyramid_{false};
  format::LayerRows window_;
  LayerPyramid grad_window_{false};
  std::unique_ptr<format::LayerRowsFetch> fetch_;
  bool fetch_failed_ = false;
};

}  // namespace nanscope::viewer
