#include <imgui.h>

#include <string>

#include "nanscope/format/advice_words.hpp"
#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"
#include "plot_widget.hpp"

namespace nanscope::viewer {

namespace {
constexpr float kPlotHeight = 190;
}

void draw_layer_plots_panel(const ViewModel& model, UiState& ui) {
  if (ui.active_run < 0 || size_t(ui.active_run) >= model.runs.size()) return;
  const RunSource& run = model.runs[ui.active_run];
  const format::RunData& data = run.data();
  const size_t layers = data.layer_names.size();
  if (layers == 0) return;
  // Without a click, the layer heading the table (by default: the largest norm).
  size_t layer = 0;
  if (ui.selected_layer >= 0 && size_t(ui.selected_layer) < layers)
    layer = size_t(ui.selected_layer);
  else if (!ui.layer_rows.empty())
    layer = ui.layer_rows.front().layer;
  const std::string name = data.layer_names[layer].empty() ? "(root)" : data.layer_names[layer];

  const float spacing = ImGui::GetStyle().ItemSpacing.x;
  const float half = (ImGui::GetContentRegionAvail().x - spacing) * 0.5f;
  static PlotSpec spec;
  static std::string title;

  spec.clear();
  title = "grad norm of " + name;
  spec.title = title.c_str();
  if (run.has_layer_table(OverviewTable::layer_grad_norm)) {
    spec.lines.push_back({name.c_str(), run.layer_row_steps(), run.layer_rows(OverviewTable::layer_grad_norm, layer),
                          run_color(size_t(ui.active_run)), false, run.layer_rows_off_curve(),
                          run.layer_blocks(OverviewTable::layer_grad_norm, layer)});
    spec.markers.push_back(&data.events);
  }
  ui.regions["plot.layer_norm"] = draw_plot(spec, half, kPlotHeight, ui.steps, model.step_extent(), ui.layer_norm);
  ImGui::SameLine();

  spec.clear();
  title = "activation abs-max of " + name;
  spec.title = title.c_str();
  ImGui::BeginGroup();
  if (!run.has_layer_table(OverviewTable::layer_act_absmax)) {
    ImGui::TextUnformatted(spec.title);
    // Worded for whoever ran the loop: a flag, a GuardOptions field, a keyword argument.
    static std::string hint;
    hint = "not recorded: " + format::how_to_set(data.origin, format::advice_words(data.origin).act_absmax_every);
    ImGui::TextDisabled("%s", hint.c_str());
  } else {
    spec.lines.push_back({name.c_str(), run.layer_row_steps(), run.layer_rows(OverviewTable::layer_act_absmax, layer),
                          run_color(size_t(ui.active_run)), /*nan_is_missing=*/true, run.layer_rows_off_curve(),
                          run.layer_blocks(OverviewTable::layer_act_absmax, layer)});
    spec.markers.push_back(&data.events);
    // Headroom: how far the layer's activations sit below each format's largest value.
    spec.references.push_back({kFp16Max, rgba(255, 120, 40), "fp16 max"});
    spec.references.push_back({kBf16Max, rgba(255, 200, 60), "bf16 max 3.4e38"});
    ui.regions["plot.act_absmax"] = draw_plot(spec, half, kPlotHeight, ui.steps, model.step_extent(), ui.act_absmax);
  }
  ImGui::EndGroup();
}

}  // namespace nanscope::viewer
