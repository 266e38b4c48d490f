#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"

namespace nanscope::viewer {

namespace {

constexpr float kNameMargin = 150, kLegendWidth = 90;

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

}  // namespace

void draw_heatmap_panel(const ViewModel& model, UiState& ui) {
  ImGui::TextUnformatted("grad norm per layer (log colour: largest value in each pixel's steps)");
  if (ui.active_run < 0 || size_t(ui.active_run) >= model.runs.size()) return;
  const RunSource& run = model.runs[ui.active_run];
  const LayerPyramid& pyramid = run.grad_norms();
  const format::RunData& data = run.data();
  if (pyramid.layers() == 0) {
    ImGui::TextDisabled("%s has no per-layer grad norms (trained with --probe off?)", run.label().c_str());
    return;
  }
  const float width = ImGui::GetContentRegionAvail().x;
  const float height = std::clamp(float(pyramid.layers()) * 14.0f, 140.0f, 300.0f);
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("heatmap", {width, height});
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 lo{origin.x + kNameMargin, origin.y};
  const ImVec2 hi{origin.x + width - kLegendWidth, origin.y + height};
  const size_t columns = size_t(std::max(1.0f, hi.x - lo.x));
  const LogScale scale = LogScale::spanning(pyramid.finite_min(), pyramid.finite_max());

  HeatmapState& h = ui.grad_heatmap;
  if (h.source != &run || h.rows != pyramid.rows() || h.columns != columns || h.x.lo != ui.steps.x.lo ||
      h.x.hi != ui.steps.x.hi) {
    render_heatmap(pyramid, data.step.data(), ui.steps.x.lo, ui.steps.x.hi, columns, scale, h.image);
    h.texture.upload(h.image.rgba.data(), h.image.columns, h.image.rows);
    h.source = &run;
    h.rows = pyramid.rows();
    h.columns = columns;
    h.x = ui.steps.x;
  }
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->AddRectFilled(lo, hi, rgba(22, 24, 28));
  if (!h.texture.empty()) dl->AddImage(h.texture.id(), lo, hi);
  ui.regions["heatmap"] = {lo.x, lo.y, hi.x - lo.x, hi.y - lo.y};

  // Layer names: every one when rows are tall enough, else every n-th.
  const size_t layers = pyramid.layers();
  const float row_height = (hi.y - lo.y) / float(layers);
  const size_t every = size_t(std::ceil(13.0f / std::max(1.0f, row_height)));
  dl->PushClipRect({origin.x, lo.y}, {lo.x - 4, hi.y}, true);
  for (size_t l = 0; l < layers; l += every) {
    const char* name = data.layer_names[l].empty() ? "(root)" : data.layer_names[l].c_str();
    const float text_width = ImGui::CalcTextSize(name).x;
    dl->AddText({lo.x - 6 - text_width, lo.y + row_height * (float(l) + 0.5f) - 7},
                int(l) == ui.selected_layer ? rgba(255, 255, 255) : rgba(180, 180, 180), name);
  }
  dl->PopClipRect();
  if (ui.selected_layer >= 0 && size_t(ui.selected_layer) < layers)
    dl->AddRect({lo.x - 1, lo.y + row_height * ui.selected_layer},
                {hi.x + 1, lo.y + row_height * (ui.selected_layer + 1)}, rgba(255, 255, 255));
  draw_legend(dl, {hi.x + 10, lo.y}, height, scale);

  const ImGuiIO& io = ImGui::GetIO();
  if (hovered && io.MousePos.x >= lo.x && io.MousePos.x < hi.x) {
    const size_t layer = std::min(layers - 1, size_t((io.MousePos.y - lo.y) / row_height));
    const size_t column = std::min(columns - 1, size_t(io.MousePos.x - lo.x));
    const double per_column = ui.steps.x.span() / double(columns);
    const double first = std::ceil(ui.steps.x.lo + per_column * double(column));
    const double last = std::ceil(ui.steps.x.lo + per_column * double(column + 1)) - 1;
    char value[32];
    format_value(h.image.at(layer, column), value, sizeof value);
    ImGui::BeginTooltip();
    ImGui::Text("layer %s", data.layer_names[layer].empty() ? "(root)" : data.layer_names[layer].c_str());
    if (last > first)
      ImGui::Text("steps %.0f-%.0f", first, last);
    else
      ImGui::Text("step %.0f", first);
    ImGui::Text("grad norm %s%s", value, last > first ? " (largest)" : "");
    ImGui::TextDisabled("click: plot this layer");
    ImGui::EndTooltip();
    if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) ui.selected_layer = int(layer);
    if (io.MouseWheel != 0) {
      const double anchor = ui.steps.x.lo + per_column * double(io.MousePos.x - lo.x);
      const AxisRange extent = model.step_extent();
      ui.steps.x = clamped(zoomed(ui.steps.x, anchor, std::pow(0.85, double(io.MouseWheel))),
                           {extent.lo - 0.05 * extent.span(), extent.hi + 0.05 * extent.span()}, 4.0);
      ui.steps.follow = false;
    }
  }
}

}  // namespace nanscope::viewer
