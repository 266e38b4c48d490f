#include "nanscope/viewer/layer_table.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "nanscope/format/event_text.hpp"

namespace nanscope::viewer {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A NaN or Inf grad norm sorts above every finite one.
double norm_sort_value(double v) { return std::isfinite(v) ? v : std::numeric_limits<double>::infinity(); }
// An unknown growth or abs-max (NaN) sorts below every known one.
double known_sort_value(double v) { return std::isnan(v) ? -std::numeric_limits<double>::infinity() : v; }

}  // namespace

double LayerRow::fp16_headroom_bits() const {
  return act_absmax > 0 && std::isfinite(act_absmax) ? std::log2(kFp16Max / act_absmax) : kNaN;
}

namespace {

// Each layer's row, its numbers unknown, with the latest warning naming it.
void start_rows(const format::RunData& run, std::vector<LayerRow>& out) {
  const size_t layers = run.layer_names.size();
  out.resize(layers);
  std::map<std::string, int64_t> latest_warning;  // layer -> index of the latest warning naming it
  for (size_t e = 0; e < run.events.size(); ++e)
    if (run.events[e].kind == format::EventKind::warning)
      latest_warning[format::warning_where(run.events[e].text)] = int64_t(e);
  for (size_t l = 0; l < layers; ++l) {
    LayerRow& row = out[l];
    row = LayerRow{};
    row.layer = l;
    row.last_norm = row.growth = row.act_absmax = kNaN;
    if (auto it = latest_warning.find(run.layer_names[l]); it != latest_warning.end()) row.warning_event = it->second;
  }
}

}  // namespace

void layer_rows(const format::RunData& run, size_t window, std::vector<LayerRow>& out) {
  const size_t layers = run.layer_names.size();
  const size_t rows = run.rows();
  start_rows(run, out);
  const bool has_norms = run.layer_grad_norm.size() == rows * layers && rows > 0;
  const bool has_act = run.layer_act_absmax.size() == rows * layers && rows > 0;
  const size_t begin = rows > window ? rows - window : 0;
  for (size_t l = 0; l < layers; ++l) {
    LayerRow& row = out[l];
    if (has_norms) {
      double first_finite = kNaN, last_finite = kNaN;
      for (size_t i = begin; i < rows; ++i) {
        const double v = run.layer_grad_norm[i * layers + l];
        if (!std::isfinite(v)) {
          row.nonfinite = true;
          continue;
        }
        if (std::isnan(first_finite)) first_finite = v;
        last_finite = v;
      }
      row.last_norm = run.layer_grad_norm[(rows - 1) * layers + l];
      if (first_finite > 0) row.growth = last_finite / first_finite;
      if (row.nonfinite) row.growth = std::numeric_limits<double>::infinity();
    }
    if (has_act) {
      for (size_t i = 0; i < rows; ++i) {
        const double v = run.layer_act_absmax[i * layers + l];
        if (std::isnan(v)) continue;  // not recorded on this step
        row.act_absmax = std::isnan(row.act_absmax) ? v : std::max(row.act_absmax, v);
      }
    }
  }
}

void layer_rows(const format::RunData& run, const format::RunOverview& overview, size_t window,
                std::vector<LayerRow>& out) {
  start_rows(run, out);
  const format::OverviewLevel& finest = overview.levels.at(0);
  const size_t blocks = finest.blocks();
  if (blocks == 0) return;
  const format::BlockStats<float>& norms = finest.layer_grad_norm;
  // The largest abs-max of the whole run: the coarsest level's few blocks hold it.
  const format::BlockStats<float>& act = overview.levels.back().layer_act_absmax;
  // The blocks the last `window` rows reach into, and the one before them.
  size_t first = blocks - 1;
  for (int64_t rows = finest.rows[first]; first > 0 && rows < int64_t(window); rows += finest.rows[--first]) {}
  for (size_t l = 0; l < out.size(); ++l) {
    LayerRow& row = out[l];
    if (l < norms.width) {
      double first_finite = first > 0 ? norms.last[(first - 1) * norms.width + l] : kNaN;
      double last_finite = kNaN;
      for (size_t b = first; b < blocks; ++b) {
        const size_t at = b * norms.width + l;
        row.nonfinite |= norms.nan[at] > 0 || norms.inf[at] > 0;
        const double last = norms.last[at], some = std::isfinite(last) ? last : norms.max[at];
        if (std::isnan(first_finite) || !std::isfinite(first_finite)) first_finite = norms.min[at];
        if (std::isfinite(some)) last_finite = some;
      }
      row.last_norm = norms.last[(blocks - 1) * norms.width + l];
      if (first_finite > 0) row.growth = last_finite / first_finite;
      if (row.nonfinite) row.growth = std::numeric_limits<double>::infinity();
    }
    if (l < act.width) {
      for (size_t b = 0; b < act.blocks(); ++b) {
        const size_t at = b * act.width + l;
        const double v = act.inf[at] > 0 ? std::numeric_limits<double>::infinity() : double(act.max[at]);
        if (!std::isnan(v)) row.act_absmax = std::isnan(row.act_absmax) ? v : std::max(row.act_absmax, v);
      }
    }
  }
}

void sort_layer_rows(std::vector<LayerRow>& rows, const format::RunData& run, LayerSort key, bool descending) {
  auto less = [&](const LayerRow& a, const LayerRow& b) {
    switch (key) {
      case LayerSort::name: return run.layer_names[a.layer] < run.layer_names[b.layer];
      case LayerSort::norm: return norm_sort_value(a.last_norm) < norm_sort_value(b.last_norm);
      case LayerSort::growth: return known_sort_value(a.growth) < known_sort_value(b.growth);
      case LayerSort::act_absmax: return known_sort_value(a.act_absmax) < known_sort_value(b.act_absmax);
    }
    return false;
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const LayerRow& a, const LayerRow& b) { return descending ? less(b, a) : less(a, b); });
}

}  // namespace nanscope::viewer
