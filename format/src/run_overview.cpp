#include "nanscope/format/run_overview.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace nanscope::format {

template <typename T>
void BlockStats<T>::add_block() {
  const T none = std::numeric_limits<T>::quiet_NaN();
  min.insert(min.end(), width, none);
  max.insert(max.end(), width, none);
  last.insert(last.end(), width, none);
  nan.insert(nan.end(), width, 0);
  inf.insert(inf.end(), width, 0);
}

template <typename T>
void BlockStats<T>::add_row(size_t block, const T* values) {
  const size_t base = block * width;
  for (size_t i = 0; i < width; ++i) {
    const T v = values[i];
    const size_t at = base + i;
    if (std::isfinite(v)) {
      min[at] = std::isnan(min[at]) ? v : std::min(min[at], v);
      max[at] = std::isnan(max[at]) ? v : std::max(max[at], v);
      last[at] = v;
    } else if (std::isnan(v)) {
      if (nan_is_missing) continue;  // not recorded this step: the last recorded value stays
      ++nan[at];
      last[at] = v;
    } else {
      ++inf[at];
      last[at] = v;
    }
  }
}

template <typename T>
void BlockStats<T>::fold(size_t block, const BlockStats& other, size_t from) {
  const size_t base = block * width, src = from * width;
  for (size_t i = 0; i < width; ++i) {
    const size_t at = base + i, o = src + i;
    if (!std::isnan(other.min[o])) min[at] = std::isnan(min[at]) ? other.min[o] : std::min(min[at], other.min[o]);
    if (!std::isnan(other.max[o])) max[at] = std::isnan(max[at]) ? other.max[o] : std::max(max[at], other.max[o]);
    nan[at] += other.nan[o];
    inf[at] += other.inf[o];
    // A later block's last value, unless it recorded nothing.
    const bool recorded = !std::isnan(other.last[o]) || other.nan[o] > 0;
    if (recorded || !nan_is_missing) last[at] = other.last[o];
  }
}

template <typename T>
void BlockStats<T>::reserve_blocks(size_t blocks) {
  for (std::vector<T>* v : {&min, &max, &last}) v->reserve(blocks * width);
  for (std::vector<uint32_t>* v : {&nan, &inf}) v->reserve(blocks * width);
}

template <typename T>
void BlockStats<T>::keep_blocks(size_t blocks) {
  const size_t n = std::min(min.size(), blocks * width);
  for (std::vector<T>* v : {&min, &max, &last}) v->resize(n);
  for (std::vector<uint32_t>* v : {&nan, &inf}) v->resize(n);
}

template struct BlockStats<double>;
template struct BlockStats<float>;

namespace {

void open_block(OverviewLevel& level, int64_t first_step) {
  level.first_step.push_back(first_step);
  level.last_step.push_back(first_step);
  level.rows.push_back(0);
  level.skipped.push_back(0);
  level.scalars.add_block();
  level.layer_grad_norm.add_block();
  level.layer_act_absmax.add_block();
}

// Block `from` of `src`, which comes after what block `to` of `dst` holds, folded into it.
void fold_block(OverviewLevel& dst, size_t to, const OverviewLevel& src, size_t from) {
  if (dst.rows[to] == 0) dst.first_step[to] = src.first_step[from];
  dst.last_step[to] = src.last_step[from];
  dst.rows[to] += src.rows[from];
  dst.skipped[to] += src.skipped[from];
  dst.scalars.fold(to, src.scalars, from);
  dst.layer_grad_norm.fold(to, src.layer_grad_norm, from);
  dst.layer_act_absmax.fold(to, src.layer_act_absmax, from);
}

void append_block(OverviewLevel& dst, const OverviewLevel& src, size_t from) {
  open_block(dst, src.first_step[from]);
  fold_block(dst, dst.blocks() - 1, src, from);
}

void clear_blocks(OverviewLevel& level) { keep_blocks(level, 0); }

}  // namespace

void keep_blocks(OverviewLevel& level, size_t blocks) {
  if (blocks >= level.blocks()) return;
  for (auto* v : {&level.first_step, &level.last_step, &level.rows, &level.skipped}) v->resize(blocks);
  level.scalars.keep_blocks(blocks);
  level.layer_grad_norm.keep_blocks(blocks);
  level.layer_act_absmax.keep_blocks(blocks);
}

OverviewLevel empty_overview_level(size_t level, size_t layers, bool act_absmax) {
  OverviewLevel out;
  out.block_rows = kOverviewBlockRows.at(level);
  out.scalars.width = kOverviewScalars;
  out.layer_grad_norm.width = layers;
  out.layer_act_absmax.width = act_absmax ? layers : 0;
  out.layer_act_absmax.nan_is_missing = true;  // recorded every N steps: NaN is "not this step"
  return out;
}

OverviewBuilder::OverviewBuilder(size_t layers, bool act_absmax) {
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k) {
    open_.push_back(empty_overview_level(k, layers, act_absmax));
    completed_.push_back(empty_overview_level(k, layers, act_absmax));
  }
}

void OverviewBuilder::add(const RowsView& r) {
  OverviewLevel& finest = open_[0];
  const size_t layers = finest.layer_grad_norm.width;
  const bool act = finest.layer_act_absmax.width > 0;
  for (size_t i = 0; i < r.n; ++i) {
    if (finest.blocks() == 0) open_block(finest, r.step[i]);
    const double scalars[kOverviewScalars] = {r.loss[i], r.lr[i], r.loss_scale[i], r.grad_norm[i], r.step_time[i]};
    finest.scalars.add_row(0, scalars);
    if (layers > 0 && r.layer_grad_norm) finest.layer_grad_norm.add_row(0, r.layer_grad_norm + i * layers);
    if (act && r.layer_act_absmax) finest.layer_act_absmax.add_row(0, r.layer_act_absmax + i * layers);
    finest.last_step[0] = r.step[i];
    finest.skipped[0] += r.skipped[i] != 0;
    if (++finest.rows[0] == finest.block_rows) complete(0);
  }
}

void OverviewBuilder::complete(size_t level) {
  append_block(completed_[level], open_[level], 0);
  if (level + 1 < open_.size()) add_stored_block(level, open_[level], 0);
  clear_blocks(open_[level]);
}

void OverviewBuilder::add_stored_block(size_t level, const OverviewLevel& stored, size_t block) {
  OverviewLevel& next = open_.at(level + 1);
  if (next.blocks() == 0) open_block(next, stored.first_step[block]);
  fold_block(next, 0, stored, block);
  if (next.rows[0] == next.block_rows) complete(level + 1);
}

std::vector<OverviewLevel> OverviewBuilder::take_completed() {
  // Moved out, not copied: the writer asks at every flush.
  std::vector<OverviewLevel> out = std::move(completed_);
  completed_.clear();
  for (size_t k = 0; k < out.size(); ++k)
    completed_.push_back(empty_overview_level(k, out[k].layer_grad_norm.width, out[k].layer_act_absmax.width > 0));
  return out;
}

void OverviewBuilder::publish_into(std::vector<OverviewLevel>& levels) {
  const std::vector<OverviewLevel> completed = take_completed(), open = open_blocks();
  published_open_.resize(levels.size(), 0);
  for (size_t k = 0; k < levels.size(); ++k) {
    keep_blocks(levels[k], levels[k].blocks() - std::min(levels[k].blocks(), published_open_[k]));
    append_blocks(levels[k], completed[k]);
    append_blocks(levels[k], open[k]);
    published_open_[k] = open[k].blocks();
  }
}

std::vector<OverviewLevel> OverviewBuilder::open_blocks() const {
  std::vector<OverviewLevel> out;
  for (size_t k = 0; k < open_.size(); ++k) {
    OverviewLevel level = open_[k];
    // The finer levels' open blocks come after what this one holds.
    if (k > 0 && out[k - 1].blocks() > 0) {
      if (level.blocks() == 0)
        append_block(level, out[k - 1], 0);
      else
        fold_block(level, 0, out[k - 1], 0);
    }
    out.push_back(std::move(level));
  }
  return out;
}

void OverviewBuilder::reset() {
  for (OverviewLevel& level : open_) clear_blocks(level);
  for (OverviewLevel& level : completed_) clear_blocks(level);
  published_open_.clear();
}

RowsView rows_view(const RunData& run, size_t begin, size_t end) {
  RowsView v;
  v.n = end - begin;
  v.layers = run.layer_names.size();
  v.step = run.step.data() + begin;
  v.loss = run.loss.data() + begin;
  v.lr = run.lr.data() + begin;
  v.loss_scale = run.loss_scale.data() + begin;
  v.grad_norm = run.grad_norm.data() + begin;
  v.step_time = run.step_time.data() + begin;
  v.skipped = run.skipped.data() + begin;
  if (!run.layer_grad_norm.empty()) v.layer_grad_norm = run.layer_grad_norm.data() + begin * v.layers;
  if (!run.layer_act_absmax.empty()) v.layer_act_absmax = run.layer_act_absmax.data() + begin * v.layers;
  return v;
}

void append_blocks(OverviewLevel& dst, const OverviewLevel& src) {
  for (size_t b = 0; b < src.blocks(); ++b) append_block(dst, src, b);
}

RunOverview build_overview(const RunData& run) {
  const size_t layers = run.layer_grad_norm.empty() ? 0 : run.layer_names.size();
  OverviewBuilder builder(layers, !run.layer_act_absmax.empty());
  builder.add(rows_view(run, 0, run.rows()));
  RunOverview out;
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k)
    out.levels.push_back(empty_overview_level(k, layers, !run.layer_act_absmax.empty()));
  builder.publish_into(out.levels);
  out.rows = int64_t(run.rows());
  out.built_from_rows = true;
  return out;
}

}  // namespace nanscope::format
