#pragma once
// One run file in the viewer: its rows (followed while the run is written),
// the pyramids the heatmaps read, and the error that stopped it, if any. A run
// that goes bad while followed keeps every row read before.
#include <memory>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "nanscope/viewer/axes.hpp"
#include "nanscope/viewer/layer_pyramid.hpp"

namespace nanscope::viewer {

class RunSource {
 public:
  // Never throws: a file that cannot be read keeps its message in error().
  // `rank`: which process of a multi-process run wrote it (-1: a one-process
  // run, or a file opened on its own).
  explicit RunSource(const std::string& path, int rank = -1);
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
  // Rows that arrived after the file was opened: the run is live.
  size_t rows_since_open() const { return data().rows() - rows_at_open_; }

  const LayerPyramid& grad_norms() const { return grad_norms_; }
  const LayerPyramid& act_absmax() const { return act_absmax_; }
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

  std::string path_, label_, error_;
  int rank_ = -1;
  std::unique_ptr<format::RunFollower> follower_;
  bool following_ = false;
  size_t rows_at_open_ = 0;
  LayerPyramid grad_norms_{false};
  LayerPyramid act_absmax_{true};
  int64_t first_nonfinite_step_ = -1;
  bool has_loss_scaler_ = false;
  std::vector<uint8_t> rolled_back_, off_curve_;
  std::vector<format::RunEvent> sentinel_events_;
  size_t events_seen_ = 0;
};

}  // namespace nanscope::viewer
