#include <imgui.h>

#include <algorithm>

#include "panels.hpp"
#include "plot_widget.hpp"

namespace nanscope::viewer {

namespace {

constexpr float kPlotHeight = 190;

using Column_ = const std::vector<double> format::RunData::*;

// Which runs a plot draws: every visible one, or only those `shows` admits.
using RunFilter = bool (*)(const RunSource&);

// One plot of a per-step column, a line per visible run, events as markers.
void scalar_plot(const char* title, Column_ column, format::OverviewScalar scalar, const ViewModel& model, UiState& ui,
                 PlotState& state, float width, const char* region, RunFilter shows = nullptr) {
  static PlotSpec spec;  // rebuilt every frame, capacity kept
  spec.clear();
  spec.title = title;
  for (size_t i = 0; i < model.runs.size(); ++i) {
    if (!run_visible(ui, i) || (shows && !shows(model.runs[i]))) continue;
    const format::RunData& run = model.runs[i].data();
    spec.lines.push_back({model.runs[i].label().c_str(), run.step.data(), series(run.*column), run_color(i), false,
                          model.runs[i].off_curve().data(), model.runs[i].scalar_blocks(scalar)});
    spec.markers.push_back(&run.events);
  }
  ui.regions[region] = draw_plot(spec, width, kPlotHeight, ui.steps, model.step_extent(), state);
}

bool has_loss_scaler(const RunSource& run) { return run.has_loss_scaler(); }

// Only fp16 has a loss scaler: a bf16 or fp32 run's scale is a flat 1 that
// reads like a scaler stuck at 1. The plot shows the runs with fp16 steps,
// and with none of them, says there is no scaler instead.
void loss_scale_plot(const ViewModel& model, UiState& ui, float width) {
  size_t with_scaler = 0, visible = 0;
  for (size_t i = 0; i < model.runs.size(); ++i) {
    if (!run_visible(ui, i)) continue;
    ++visible;
    with_scaler += model.runs[i].has_loss_scaler();
  }
  if (with_scaler > 0) {
    scalar_plot(with_scaler == visible ? "loss scale" : "loss scale (fp16 runs; bf16/fp32 runs have no scaler)",
                &format::RunData::loss_scale, format::OverviewScalar::loss_scale, model, ui, ui.loss_scale, width,
                "plot.loss_scale", has_loss_scaler);
    return;
  }
  const ImVec2 at = ImGui::GetCursorScreenPos();
  ImGui::BeginGroup();
  ImGui::TextUnformatted("loss scale");
  ImGui::TextDisabled("no scaler (bf16/fp32): only fp16 steps scale the loss (playbook P5, P6)");
  // As tall as the plot it stands for, so the grad-norm plot below stays level with the LR plot.
  ImGui::Dummy({width, std::max(0.0f, kPlotHeight - (ImGui::GetCursorScreenPos().y - at.y))});
  ImGui::EndGroup();
  ui.regions["note.loss_scale"] = {at.x, at.y, width, kPlotHeight};
}

}  // namespace

void draw_scalar_plots_panel(const ViewModel& model, UiState& ui) {
  const float spacing = ImGui::GetStyle().ItemSpacing.x;
  const float half = (ImGui::GetContentRegionAvail().x - spacing) * 0.5f;
  ImGui::BeginGroup();
  scalar_plot("loss", &format::RunData::loss, format::OverviewScalar::loss, model, ui, ui.loss, half, "plot.loss");
  scalar_plot("learning rate", &format::RunData::lr, format::OverviewScalar::lr, model, ui, ui.lr, half, "plot.lr");
  ImGui::EndGroup();
  ImGui::SameLine();
  ImGui::BeginGroup();
  loss_scale_plot(model, ui, half);
  scalar_plot("grad norm (global, unscaled)", &format::RunData::grad_norm, format::OverviewScalar::grad_norm, model, ui,
              ui.grad_norm, half, "plot.grad_norm");
  ImGui::EndGroup();
}

}  // namespace nanscope::viewer
