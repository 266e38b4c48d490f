#include "nanscope/viewer/run_source.hpp"

#include <cmath>
#include <filesystem>

#include "nanscope/format/error.hpp"
#include "nanscope/format/event_text.hpp"

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

RunSource::RunSource(const std::string& path, int rank) : path_(path), label_(label_for(path, rank)), rank_(rank) {
  try {
    follower_ = std::make_unique<format::RunFollower>(path);
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

size_t RunSource::poll() {
  if (!following_) return 0;
  const size_t before = data().rows();
  try {
    const size_t added = follower_->refresh();
    if (added > 0) absorb_new_rows(before);
    if (added > 0 || data().events.size() != events_seen_) absorb_events();
    return added;
  } catch (const std::exception& e) {
    following_ = false;
    error_ = std::string("stopped following: ") + e.what();
    return 0;
  }
}

void RunSource::absorb_new_rows(size_t from) {
  const format::RunData& run = data();
  const size_t layers = run.layer_names.size();
  grad_norms_.update(run.layer_grad_norm, run.rows(), run.layer_grad_norm.empty() ? 0 : layers);
  act_absmax_.update(run.layer_act_absmax, run.rows(), run.layer_act_absmax.empty() ? 0 : layers);
  for (size_t i = from; i < run.rows() && first_nonfinite_step_ < 0; ++i)
    if (!std::isfinite(run.loss[i]) || !std::isfinite(run.grad_norm[i])) first_nonfinite_step_ = run.step[i];
  for (size_t i = from; i < run.rows() && !has_loss_scaler_; ++i)
    has_loss_scaler_ = run.amp[i] == static_cast<uint8_t>(format::Precision::fp16);
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

AxisRange RunSource::step_extent() const {
  const format::RunData& run = data();
  if (run.rows() == 0) return {0, 1};
  return {double(run.step.front()), double(run.step.back()) + 1};
}

}  // namespace nanscope::viewer
