#include "nanscope/viewer/overview_layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nanscope/format/bulk_buffer.hpp"
#include "nanscope/format/error.hpp"

namespace nanscope::viewer {

namespace {

// What a block shows as one cell: NaN if it held a NaN, +Inf if an Inf, else
// its largest value (NaN for act_absmax when nothing was recorded in it).
void block_cells(const format::BlockStats<float>& stats, size_t from_block, std::vector<float>& cells,
                 LayerPyramid& pyramid) {
  const size_t width = stats.width, blocks = stats.blocks();
  // Room for a followed run to double: its new blocks never move the cells.
  if (cells.capacity() < blocks * width) format::reserve_bulk(cells, 2 * blocks * width);
  cells.resize(blocks * width);
  for (size_t i = from_block * width; i < blocks * width; ++i) {
    cells[i] = stats.nan[i] > 0   ? std::numeric_limits<float>::quiet_NaN()
               : stats.inf[i] > 0 ? std::numeric_limits<float>::infinity()
                                  : stats.max[i];
    pyramid.note_finite(stats.min[i]);
  }
  pyramid.update(cells, blocks, width, from_block);
}

}  // namespace

OverviewLayers::OverviewLayers(const std::string& path, size_t layers,
                               std::unique_ptr<format::OverviewFollower> follower)
    : path_(path), layers_(layers), follower_(std::move(follower)) {
  rebuild_blocks(0);
}

OverviewLayers::~OverviewLayers() = default;

bool OverviewLayers::refresh() {
  // The open block of each level is rewritten as rows arrive: the pyramids
  // are redone from the finest level's open block on.
  const size_t open_block = std::max<size_t>(1, overview().levels[0].blocks()) - 1;
  if (follower_->refresh() == 0) return false;
  rebuild_blocks(open_block);
  return true;
}

void OverviewLayers::rebuild_blocks(size_t first_changed_block) {
  const format::OverviewLevel& finest = overview().levels[0];
  if (finest.layer_grad_norm.width > 0)
    block_cells(finest.layer_grad_norm, first_changed_block, grad_blocks_, grad_blocks_pyramid_);
}

LayerGrid OverviewLayers::grad_norm_blocks() const {
  const format::OverviewLevel& finest = overview().levels[0];
  return {&grad_blocks_pyramid_, finest.first_step.data(), finest.last_step.data(), double(finest.block_rows)};
}

LayerGrid OverviewLayers::grad_norm_window() const {
  if (window_.rows() == 0 || grad_window_.rows() == 0) return {};
  return rows_grid(grad_window_, window_.step.data());
}

SeriesView OverviewLayers::window_series(OverviewTable table, size_t layer) const {
  const std::vector<float>& values = table == OverviewTable::layer_act_absmax ? window_.act_absmax : window_.grad_norm;
  if (layer >= layers_ || values.empty()) return {};
  return layer_series(values, layers_, layer);
}

void OverviewLayers::want_rows(size_t from, size_t to) {
  if (fetch_ || fetch_failed_ || to <= from) return;
  if (window_.rows() > 0 && window_.from <= from && to <= window_.to()) return;
  const format::OverviewLevel& finest = overview().levels[0];
  fetch_ = std::make_unique<format::LayerRowsFetch>(path_, from, to, layers_, finest.layer_grad_norm.width > 0,
                                                    finest.layer_act_absmax.width > 0);
}

bool OverviewLayers::take_fetched() {
  if (!fetch_) return false;
  try {
    if (!fetch_->ready()) return false;
    window_ = fetch_->take();
  } catch (const format::FormatError&) {
    fetch_.reset();
    fetch_failed_ = true;
    throw;
  }
  fetch_.reset();
  // A new window is a new table: the pyramid starts over.
  grad_window_ = LayerPyramid(false);
  if (!window_.grad_norm.empty()) grad_window_.update(window_.grad_norm, window_.rows(), layers_);
  return true;
}

}  // namespace nanscope::viewer
