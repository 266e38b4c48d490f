#include <imgui.h>

#include "panels.hpp"
#include "plot_widget.hpp"

namespace nanscope::viewer {

namespace {

constexpr float kPlotHeight = 190;

using Column_ = const std::vector<double> format::RunData::*;

// One plot of a per-step column, a line per visible run, events as markers.
void scalar_plot(const char* title, Column_ column, const ViewModel& model, UiState& ui, PlotState& state, float width,
                 const char* region) {
  static PlotSpec spec;  // rebuilt every frame, capacity kept
  spec.clear();
  spec.title = title;
  for (size_t i = 0; i < model.runs.size(); ++i) {
    if (!run_visible(ui, i)) continue;
    const format::RunData& run = model.runs[i].data();
    spec.lines.push_back({model.runs[i].label().c_str(), run.step.data(), series(run.*column), run_color(i), false,
                          model.runs[i].off_curve().data()});
    spec.markers.push_back(&run.events);
  }
  ui.regions[region] = draw_plot(spec, width, kPlotHeight, ui.steps, model.step_extent(), state);
}

}  // namespace

void draw_scalar_plots_panel(const ViewModel& model, UiState& ui) {
  const float spacing = ImGui::GetStyle().ItemSpacing.x;
  const float half = (ImGui::GetContentRegionAvail().x - spacing) * 0.5f;
  ImGui::BeginGroup();
  scalar_plot("loss", &format::RunData::loss, model, ui, ui.loss, half, "plot.loss");
  scalar_plot("learning rate", &format::RunData::lr, model, ui, ui.lr, half, "plot.lr");
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  scalar_plot("loss scale", &format::RunData::loss_scale, model, ui, ui.loss_scale, half, "plot.loss_scale");
  scalar_plot("grad norm (global, unscaled)", &format::RunData::grad_norm, model, ui, ui.grad_norm, half,
              "plot.grad_norm");
  ImGui::EndGroup();
}

}  // namespace nanscope::viewer
