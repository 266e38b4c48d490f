#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nanscope/format/advice_words.hpp"
#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"

namespace nanscope::viewer {

namespace {

constexpr float kNameMargin = 150, kLegendWidth = 90;
constexpr float kRankGap = 20;  // room for the first rank's frame, clear of its neighbours

// A colour bar with decade labels and the NaN/Inf swatches.
void draw_legend(ImDrawList* dl, ImVec2 lo, float height, const LogScale& scale) {
  constexpr int kBands = 48;
  constexpr float kBar = 14;
  const float swatches = 34;
  const float bar_height = std::max(20.0f, height - swatches);
  for (int i = 0; i < kBands; ++i) {
    const float t0 = float(i) / kBands, t1 = float(i + 1) / kBands;
    dl->AddRectFilled({lo.x, lo.y + bar_height * (1 - t1)}, {lo.x + kBar, lo.y + bar_height * (1 - t0) + 1},
                      colormap(0.5f * (t0 + t1)));
  }
  char label[32];
  for (float t : {0.0f, 0.5f, 1.0f}) {
    format_value(scale.value_at(t), label, sizeof label);
    dl->AddText({lo.x + kBar + 4, lo.y + bar_height * (1 - t) - 7}, rgba(200, 200, 200), label);
  }
  const float y = lo.y + bar_height + 6;
  dl->AddRectFilled({lo.x, y}, {lo.x + kBar, y + 12}, kNaNColor);
  dl->AddText({lo.x + kBar + 4, y - 1}, rgba(200, 200, 200), "NaN");
  dl->AddRectFilled({lo.x + 44, y}, {lo.x + 44 + kBar, y + 12}, kInfColor);
  dl->AddText({lo.x + 48 + kBar, y - 1}, rgba(200, 200, 200), "Inf");
}

// One run's heatmap in [lo, hi], from its cached image (rebuilt when the
// rows, the width, the visible steps or the shared scale changed).
void draw_run_heatmap(ImDrawList* dl, const RunSource& run, HeatmapState& h, ImVec2 lo, ImVec2 hi,
                      const StepView& steps, const LogScale& scale) {
  const size_t columns = size_t(std::max(1.0f, hi.x - lo.x));
  const LayerGrid grid = run.grad_norm_grid(steps.x, columns);
  if (h.source != &run || h.pyramid != grid.pyramid || h.revision != run.revision() || h.columns != columns ||
      h.x.lo != steps.x.lo || h.x.hi != steps.x.hi || h.scale.lo != scale.lo || h.scale.hi != scale.hi) {
    render_heatmap(grid, steps.x.lo, steps.x.hi, columns, scale, h.image);
    h.texture.upload(h.image.rgba.data(), h.image.columns, h.image.rows);
    h.source = &run;
    h.pyramid = grid.pyramid;
    h.revision = run.revision();
    h.columns = columns;
    h.x = steps.x;
    h.scale = scale;
  }
  dl->AddRectFilled(lo, hi, rgba(22, 24, 28));
  if (!h.texture.empty()) dl->AddImage(h.texture.id(), lo, hi);
}

// "rank 1" or "rank 1: first non-finite @ step 40", above a rank's heatmap.
void draw_rank_title(ImDrawList* dl, const RunSource& run, const RankGroup& group, bool active, ImVec2 at,
                     float width) {
  char title[96];
  std::snprintf(title, sizeof title, "rank %d", run.rank());
  const bool first = group.first_nonfinite.has(run.rank());
  if (first) {
    // The longest wording that fits a narrow pane (many ranks) whole.
    const long long step = static_cast<long long>(group.first_nonfinite.step);
    for (const char* wording :
         {"rank %d: first non-finite @ step %lld", "rank %d: first @ step %lld", "rank %d: first"}) {
      std::snprintf(title, sizeof title, wording, run.rank(), step);
      if (ImGui::CalcTextSize(title).x <= width) break;
    }
  }
  const uint32_t color = first ? kFirstNonfiniteRankColor : active ? rgba(255, 255, 255) : rgba(170, 170, 170);
  dl->PushClipRect(at, {at.x + width, at.y + ImGui::GetTextLineHeight()}, true);
  dl->AddText(at, color, title);
  dl->PopClipRect();
}

// The runs whose heatmaps are shown: the active run alone, or every rank of
// its group that has per-layer grad norms (reused every frame).
const std::vector<size_t>& runs_shown(const ViewModel& model, const UiState& ui, const RankGroup* group) {
  static std::vector<size_t> shown;
  shown.clear();
  if (group) {
    for (size_t run : group->runs)
      if (model.runs[run].has_layer_table(OverviewTable::layer_grad_norm)) shown.push_back(run);
  } else if (model.runs[size_t(ui.active_run)].has_layer_table(OverviewTable::layer_grad_norm)) {
    shown.push_back(size_t(ui.active_run));
  }
  return shown;
}

// One colour scale over every shown run's finite values.
LogScale shared_scale(const ViewModel& model, const std::vector<size_t>& shown) {
  double finite_min = 0, finite_max = 0;
  bool any_finite = false;
  for (size_t run : shown) {
    const double run_min = model.runs[run].grad_norm_min(), run_max = model.runs[run].grad_norm_max();
    if (!(run_max > 0)) continue;  // no rows, or none finite yet
    finite_min = any_finite ? std::min(finite_min, run_min) : run_min;
    finite_max = any_finite ? std::max(finite_max, run_max) : run_max;
    any_finite = true;
  }
  return LogScale::spanning(finite_min, finite_max);
}

// Where the panes, the layer names and the legend go.
struct HeatmapLayout {
  ImVec2 origin;
  float area_lo = 0, area_hi = 0;  // the panes, between the names and the legend
  float pane_width = 1, gap = 0;
  float top = 0, bottom = 0, row_height = 1;
  ImVec2 pane_lo(size_t k) const { return {area_lo + float(k) * (pane_width + gap), top}; }
};

// Layer names left of the first heatmap: every one when rows are tall enough, else every n-th.
void draw_layer_names(ImDrawList* dl, const format::RunData& names, int selected_layer, const HeatmapLayout& at) {
  const size_t every = size_t(std::ceil(13.0f / std::max(1.0f, at.row_height)));
  dl->PushClipRect({at.origin.x, at.top}, {at.area_lo - 4, at.bottom}, true);
  for (size_t l = 0; l < names.layer_names.size(); l += every) {
    const char* name = names.layer_names[l].empty() ? "(root)" : names.layer_names[l].c_str();
    const float text_width = ImGui::CalcTextSize(name).x;
    dl->AddText({at.area_lo - 6 - text_width, at.top + at.row_height * (float(l) + 0.5f) - 7},
                int(l) == selected_layer ? rgba(255, 255, 255) : rgba(180, 180, 180), name);
  }
  dl->PopClipRect();
}

// Hover: which rank's heatmap, which layer, which steps; a click plots that
// layer of that rank, the wheel zooms the step axis.
void hover_heatmap(const ViewModel& model, UiState& ui, const RankGroup* group, const std::vector<size_t>& shown,
                   const format::RunData& names, const HeatmapLayout& at) {
  const ImGuiIO& io = ImGui::GetIO();
  if (io.MousePos.y < at.top || io.MousePos.x < at.area_lo) return;
  const size_t k = std::min(shown.size() - 1, size_t((io.MousePos.x - at.area_lo) / (at.pane_width + at.gap)));
  const float x = io.MousePos.x - at.pane_lo(k).x;
  if (x >= at.pane_width) return;  // in the gap between two ranks
  const size_t run_index = shown[k];
  const RunSource& run = model.runs[run_index];
  const HeatmapState& h = ui.grad_heatmaps[run_index];
  if (h.image.columns == 0 || h.image.rows == 0) return;
  const size_t layers = names.layer_names.size();
  const size_t layer = std::min(std::min(layers, h.image.rows) - 1, size_t((io.MousePos.y - at.top) / at.row_height));
  const size_t column = std::min(h.image.columns - 1, size_t(x));
  const double per_column = ui.steps.x.span() / double(h.image.columns);
  const double first = std::ceil(ui.steps.x.lo + per_column * double(column));
  const double last = std::ceil(ui.steps.x.lo + per_column * double(column + 1)) - 1;
  char value[32];
  format_value(h.image.at(layer, column), value, sizeof value);
  ImGui::BeginTooltip();
  if (group) ImGui::Text("rank %d", run.rank());
  ImGui::Text("layer %s", names.layer_names[layer].empty() ? "(root)" : names.layer_names[layer].c_str());
  if (last > first)
    ImGui::Text("steps %.0f-%.0f", first, last);
  else
    ImGui::Text("step %.0f", first);
  ImGui::Text("grad norm %s%s", value, last > first ? " (largest)" : "");
  ImGui::TextDisabled(group ? "click: plot this layer of this rank" : "click: plot this layer");
  ImGui::EndTooltip();
  if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) {
    if (int(run_index) != ui.active_run) {  // the table and the layer plots follow the clicked rank
      ui.active_run = int(run_index);
      ui.layer_rows_built_for = SIZE_MAX;
    }
    ui.selected_layer = int(layer);
  }
  if (io.MouseWheel != 0) {
    const double anchor = ui.steps.x.lo + per_column * double(x);
    const AxisRange extent = model.step_extent();
    ui.steps.x = clamped(zoomed(ui.steps.x, anchor, std::pow(0.85, double(io.MouseWheel))),
                         {extent.lo - 0.05 * extent.span(), extent.hi + 0.05 * extent.span()}, 4.0);
    ui.steps.follow = false;
  }
}

}  // namespace

void draw_heatmap_panel(const ViewModel& model, UiState& ui) {
  ImGui::TextUnformatted("grad norm per layer (log colour: largest value in each pixel's steps)");
  if (ui.active_run < 0 || size_t(ui.active_run) >= model.runs.size()) return;
  const RunSource& active = model.runs[ui.active_run];
  // The active run alone, or every rank of its group side by side, all on
  // the shared step axis and one colour scale.
  const RankGroup* group = model.group_of(size_t(ui.active_run));
  const std::vector<size_t>& shown = runs_shown(model, ui, group);
  if (shown.empty()) {
    ImGui::TextDisabled("%s has no per-layer grad norms (the probe was off: %s?)", active.label().c_str(),
                        format::advice_words(active.data().origin).probe_off);
    return;
  }
  // The ranks run one model: the layer names are the same on every rank.
  const format::RunData& names = model.runs[shown.front()].data();
  const size_t layers = names.layer_names.size();
  const LogScale scale = shared_scale(model, shown);

  const float width = ImGui::GetContentRegionAvail().x;
  const float title_height = group ? ImGui::GetTextLineHeight() + 8 : 0;
  const float height = std::clamp(float(layers) * 14.0f, 140.0f, 300.0f);
  HeatmapLayout at;
  at.origin = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("heatmap", {width, title_height + height});
  const bool hovered = ImGui::IsItemHovered();
  at.area_lo = at.origin.x + kNameMargin;
  at.area_hi = at.origin.x + width - kLegendWidth;
  at.gap = shown.size() > 1 ? kRankGap : 0;
  at.pane_width = std::max(1.0f, (at.area_hi - at.area_lo - at.gap * float(shown.size() - 1)) / float(shown.size()));
  at.top = at.origin.y + title_height;
  at.bottom = at.top + height;
  at.row_height = height / float(layers);
  ui.heatmap_columns = size_t(at.pane_width);

  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (size_t k = 0; k < shown.size(); ++k) {
    const RunSource& run = model.runs[shown[k]];
    const ImVec2 lo = at.pane_lo(k), hi{lo.x + at.pane_width, at.bottom};
    draw_run_heatmap(dl, run, ui.grad_heatmaps[shown[k]], lo, hi, ui.steps, scale);
    const Region region{lo.x, lo.y, hi.x - lo.x, hi.y - lo.y};
    if (int(shown[k]) == ui.active_run) ui.regions["heatmap"] = region;
    if (group) {
      ui.regions["heatmap-rank-" + std::to_string(run.rank())] = region;
      draw_rank_title(dl, run, *group, int(shown[k]) == ui.active_run, {lo.x, at.origin.y}, at.pane_width);
      if (group->first_nonfinite.has(run.rank()))
        dl->AddRect({lo.x - 4, lo.y - 4}, {hi.x + 4, hi.y + 4}, kFirstNonfiniteRankColor, 0, 0, 3.0f);
    }
    if (ui.selected_layer >= 0 && size_t(ui.selected_layer) < layers)
      dl->AddRect({lo.x - 1, lo.y + at.row_height * ui.selected_layer},
                  {hi.x + 1, lo.y + at.row_height * (ui.selected_layer + 1)}, rgba(255, 255, 255));
  }
  draw_layer_names(dl, names, ui.selected_layer, at);
  draw_legend(dl, {at.area_hi + 10, at.top}, height, scale);
  if (hovered) hover_heatmap(model, ui, group, shown, names, at);
}

}  // namespace nanscope::viewer
