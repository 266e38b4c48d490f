#include "nanscope/viewer/run_source.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "nanscope/format/error.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/rehearsal.hpp"

namespace nanscope::viewer {

namespace {
std::string label_for(const std::string& path, int rank) {
  std::filesystem::path p(path);
  // run/run.h5 is named after its directory, run/run-rank-1.h5 "run rank 1";
  // any other file after itself.
  const bool in_run_dir = p.has_parent_path() && !p.parent_path().filename().empty();
  if (rank >= 0 && in_run_dir) return p.parent_path().filename().string() + " rank " + std::to_string(rank);
  if (p.filename() == "run.h5" && in_run_dir) return p.parent_path().filename().string();
  return p.filename().string();
}
}  // namespace

RunSource::RunSource(const std::string& path, int rank, const OverviewProgress& progress)
    : path_(path), label_(label_for(path, rank)), rank_(rank) {
  try {
    std::unique_ptr<format::OverviewFollower> overview;
    format::read_under_one_rehearsal(path, [&] {
      // The scalar rows first: they say whether the run is long.
      follower_ = std::make_unique<format::RunFollower>(path, format::LayerTables::skip);
      if (long_enough())
        overview = std::make_unique<format::OverviewFollower>(path, progress);
      else if (!follower_->data().layer_names.empty())
        follower_ = std::make_unique<format::RunFollower>(path);
    });
    if (overview)
      long_ = std::make_unique<OverviewLayers>(path, follower_->data().layer_names.size(), std::move(overview));
    following_ = true;
    rows_at_open_ = follower_->data().rows();
    absorb_new_rows(0);
    absorb_events();
  } catch (const format::FormatError& e) {
    error_ = e.what();
  } catch (const std::exception& e) {
    error_ = "'" + path + "': " + e.what();
  }
}

RunSource::RunSource(RunSource&&) noexcept = default;
RunSource& RunSource::operator=(RunSource&&) noexcept = default;
RunSource::~RunSource() = default;

const format::RunData& RunSource::data() const {
  static const format::RunData empty;
  return follower_ ? follower_->data() : empty;
}

bool RunSource::long_enough() const {
  const format::RunData& run = follower_->data();
  const size_t tables = size_t(!run.layer_names.empty()) * 2;
  return run.rows() > kLongRunRows || run.rows() * run.layer_names.size() * tables > kLongRunLayerValues;
}

void RunSource::become_long() {
  std::unique_ptr<format::RunFollower> scalars;
  std::unique_ptr<format::OverviewFollower> overview;
  format::read_under_one_rehearsal(path_, [&] {
    scalars = std::make_unique<format::RunFollower>(path_, format::LayerTables::skip);
    overview = std::make_unique<format::OverviewFollower>(path_);
  });
  long_ = std::make_unique<OverviewLayers>(path_, scalars->data().layer_names.size(), std::move(overview));
  follower_ = std::move(scalars);
  grad_norms_ = LayerPyramid(false);
}

size_t RunSource::poll() {
  size_t window_arrived = 0;
  if (long_) {
    try {
      window_arrived = long_->take_fetched();
    } catch (const format::FormatError& e) {
      window_error_ = std::string("zoomed-in rows not shown: ") + e.what();
    }
  }
  if (!following_) {
    revision_ += window_arrived;
    return window_arrived;
  }
  const size_t before = data().rows();
  try {
    size_t added = follower_->refresh();
    if (added > 0 && !long_ && long_enough()) {
      become_long();  // reads the rows again, without their per-layer tables
      added = data().rows() - before;
    }
    if (long_) long_->refresh();
    if (added > 0) absorb_new_rows(before);
    if (data().events.size() != events_seen_)
      absorb_events();
    else if (added > 0)
      absorb_rows_without_events(before);
    revision_ += added + window_arrived > 0;
    return added + window_arrived;
  } catch (const std::exception& e) {
    following_ = false;
    error_ = std::string("stopped following: ") + e.what();
    revision_ += window_arrived;
    return window_arrived;
  }
}

void RunSource::absorb_new_rows(size_t from) {
  const format::RunData& run = data();
  const size_t layers = run.layer_names.size();
  grad_norms_.update(run.layer_grad_norm, run.rows(), run.layer_grad_norm.empty() ? 0 : layers);
  for (size_t i = from; i < run.rows() && first_nonfinite_step_ < 0; ++i)
    if (!std::isfinite(run.loss[i]) || !std::isfinite(run.grad_norm[i])) first_nonfinite_step_ = run.step[i];
  for (size_t i = from; i < run.rows() && !has_loss_scaler_; ++i)
    has_loss_scaler_ = run.amp[i] == static_cast<uint8_t>(format::Precision::fp16);
}

// New rows and no new event: no rollback reaches them (an event names steps
// up to its own, all read before), so the masks only grow, at the cost of
// the new rows, not of the run.
void RunSource::absorb_rows_without_events(size_t from) {
  const format::RunData& run = data();
  rolled_back_.resize(run.rows(), 0);
  off_curve_.resize(run.rows(), 0);
  for (size_t i = from; i < run.rows(); ++i) off_curve_[i] = run.skipped[i];
}

// Events and the per-row masks that follow from them (and from new rows).
void RunSource::absorb_events() {
  const format::RunData& run = data();
  rolled_back_ = format::rolled_back_rows(run);
  sentinel_events_.clear();
  for (const format::RunEvent& e : run.events)
    if (e.kind == format::EventKind::warning || e.kind == format::EventKind::rollback ||
        e.kind == format::EventKind::stop || e.kind == format::EventKind::remedy ||
        e.kind == format::EventKind::save_refused || e.kind == format::EventKind::doom)
      sentinel_events_.push_back(e);
  events_seen_ = run.events.size();
  off_curve_.assign(run.rows(), 0);
  for (size_t i = 0; i < run.rows(); ++i)
    off_curve_[i] = run.skipped[i] || (i < rolled_back_.size() && rolled_back_[i]);
}

LayerGrid RunSource::grad_norm_grid(AxisRange view, size_t columns) const {
  if (!long_) return rows_grid(grad_norms_, data().step.data());
  const LayerGrid window = long_->grad_norm_window();
  const double steps_per_pixel = view.span() / double(std::max<size_t>(1, columns));
  const bool window_spans_view =
      !window.empty() && rows_span_view(window.first_step, window.pyramid->rows(), view.lo, view.hi,
                                        double(data().step.front()), double(data().step.back()));
  if (window_spans_view && steps_per_pixel < double(format::kOverviewBlockRows[0])) return window;
  return long_->grad_norm_blocks();
}

SeriesView RunSource::layer_rows(OverviewTable table, size_t layer) const {
  if (long_) return long_->window_series(table, layer);
  const format::RunData& run = data();
  const std::vector<float>& values =
      table == OverviewTable::layer_act_absmax ? run.layer_act_absmax : run.layer_grad_norm;
  return layer_series(values, run.layer_names.size(), layer);
}

const int64_t* RunSource::layer_row_steps() const {
  return long_ ? long_->window_rows().step.data() : data().step.data();
}

const uint8_t* RunSource::layer_rows_off_curve() const {
  const size_t from = long_ ? long_->window_rows().from : 0;
  return from < off_curve_.size() ? off_curve_.data() + from : nullptr;
}

BlockSeries RunSource::layer_blocks(OverviewTable table, size_t layer) const { return {overview(), table, layer}; }

BlockSeries RunSource::scalar_blocks(format::OverviewScalar scalar) const {
  return {overview(), OverviewTable::scalars, size_t(scalar)};
}

double RunSource::grad_norm_min() const {
  return long_ ? long_->grad_norm_blocks().pyramid->finite_min() : grad_norms_.finite_min();
}

double RunSource::grad_norm_max() const {
  return long_ ? long_->grad_norm_blocks().pyramid->finite_max() : grad_norms_.finite_max();
}

bool RunSource::has_layer_table(OverviewTable table) const {
  if (long_) {
    const format::OverviewLevel& finest = long_->overview().levels[0];
    return (table == OverviewTable::layer_act_absmax ? finest.layer_act_absmax : finest.layer_grad_norm).width > 0;
  }
  const format::RunData& run = data();
  return !run.layer_names.empty() &&
         !(table == OverviewTable::layer_act_absmax ? run.layer_act_absmax : run.layer_grad_norm).empty();
}

void RunSource::focus(AxisRange view, size_t columns) {
  if (!long_ || data().rows() == 0) return;
  const double steps_per_pixel = view.span() / double(std::max<size_t>(1, columns));
  if (steps_per_pixel >= double(format::kOverviewBlockRows[0])) return;  // the blocks are as fine as a pixel
  const format::RunData& run = data();
  // The view's rows and as many again around it, so a pan stays inside.
  const size_t first = first_at_or_after(run.step.data(), run.rows(), view.lo);
  const size_t last = first_at_or_after(run.step.data(), run.rows(), view.hi);
  const size_t margin = std::max<size_t>(64, (last - first) / 2);
  size_t from = first > margin ? first - margin : 0;
  size_t to = std::min(run.rows(), last + margin);
  if (to - from > kWindowRows) {  // a view this wide: its own rows only, centred
    const size_t centre = (first + last) / 2;
    from = centre > kWindowRows / 2 ? centre - kWindowRows / 2 : 0;
    to = std::min(run.rows(), from + kWindowRows);
  }
  long_->want_rows(from, to);
}

std::string RunSource::take_window_error() { return std::exchange(window_error_, std::string()); }

AxisRange RunSource::step_extent() const {
  const format::RunData& run = data();
  if (run.rows() == 0) return {0, 1};
  return {double(run.step.front()), double(run.step.back()) + 1};
}

}  // namespace nanscope::viewer
