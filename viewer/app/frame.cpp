#include <imgui.h>

#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"

namespace nanscope::viewer {

uint32_t run_color(size_t i) {
  // Distinct from each other and from the NaN/Inf marker colours.
  // Eight, so the ranks of an 8-process run get a colour each.
  static constexpr uint32_t palette[] = {rgba(80, 160, 255),  rgba(250, 170, 40),  rgba(90, 210, 120),
                                         rgba(80, 220, 230),  rgba(170, 130, 255), rgba(230, 230, 120),
                                         rgba(235, 235, 235), rgba(160, 200, 60)};
  return palette[i % (sizeof palette / sizeof palette[0])];
}

void draw_frame(const ViewModel& model, UiState& ui) {
  ui.run_visible.resize(model.runs.size(), true);
  if (ui.steps.follow) ui.steps.x = model.step_extent();

  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(viewport->WorkPos);
  ImGui::SetNextWindowSize(viewport->WorkSize);
  ImGui::Begin("nanscope", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoBringToFrontOnFocus |
                   ImGuiWindowFlags_NoSavedSettings);

  ImGui::BeginChild("sidebar", {430, 0}, true);
  draw_sources_panel(model, ui);
  ImGui::Separator();
  draw_layer_table_panel(model, ui);
  ImGui::EndChild();
  ImGui::SameLine();

  ImGui::BeginChild("main", {0, 0}, false);
  if (ImGui::BeginTabBar("views")) {
    // Decided before either tab is submitted: submitting one may change ui.tab.
    const ImGuiTabItemFlags pick_training =
        ui.select_tab && ui.tab == Tab::training ? ImGuiTabItemFlags_SetSelected : 0;
    const ImGuiTabItemFlags pick_snapshot =
        ui.select_tab && ui.tab == Tab::snapshot ? ImGuiTabItemFlags_SetSelected : 0;
    ui.select_tab = false;
    if (ImGui::BeginTabItem("Training", nullptr, pick_training)) {
      ui.tab = Tab::training;
      ImGui::BeginChild("training");
      draw_scalar_plots_panel(model, ui);
      draw_heatmap_panel(model, ui);
      draw_layer_plots_panel(model, ui);
      ImGui::EndChild();
      ImGui::EndTabItem();
    }
    if (ImGui::BeginTabItem("Snapshot", nullptr, pick_snapshot)) {
      ui.tab = Tab::snapshot;
      ImGui::BeginChild("snapshot");
      draw_snapshot_panel(model, ui);
      ImGui::EndChild();
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
  }
  ImGui::EndChild();
  ImGui::End();
}

}  // namespace nanscope::viewer
