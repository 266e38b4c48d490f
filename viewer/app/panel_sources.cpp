#include <imgui.h>

#include <string>

#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"

namespace nanscope::viewer {

namespace {

constexpr uint32_t kErrorText = rgba(255, 110, 110);

// "nan at aten::log in blocks.0.mlp (forward)" or why there is none.
std::string birth_line(const format::SnapshotSummary& s) {
  if (!s.capture.first_birth) return s.capture.reproduced ? "no birth recorded" : "did not reproduce";
  const format::Birth& b = *s.capture.first_birth;
  return b.kind + " at " + b.op.op + " in '" + b.op.module + "' (" + b.op.phase + ")";
}

}  // namespace

void draw_sources_panel(const ViewModel& model, UiState& ui) {
  ImGui::TextUnformatted("Runs");
  if (model.runs.empty()) ImGui::TextDisabled("(none)");
  for (size_t i = 0; i < model.runs.size(); ++i) {
    const RunSource& run = model.runs[i];
    ImGui::PushID(int(i));
    bool visible = ui.run_visible[i];
    if (ImGui::Checkbox("##visible", &visible)) ui.run_visible[i] = visible;
    ImGui::SameLine();
    ImGui::ColorButton("##color", ImColor(run_color(i)), ImGuiColorEditFlags_NoTooltip, {14, 14});
    ImGui::SameLine();
    if (ImGui::RadioButton(run.label().c_str(), ui.active_run == int(i))) {
      ui.active_run = int(i);
      ui.layer_rows_built_for = SIZE_MAX;
      ui.selected_layer = -1;
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s\nthe heatmap and the layer table show this run", run.path().c_str());
    const format::RunData& data = run.data();
    ImGui::Indent(26);
    ImGui::TextDisabled("%zu steps, %zu layers", data.rows(), data.layer_names.size());
    if (run.rows_since_open() > 0) {
      ImGui::SameLine();
      ImGui::TextColored(ImColor(rgba(120, 220, 120)), "live: +%zu since opened", run.rows_since_open());
    }
    if (run.first_nonfinite_step() >= 0) {
      ImGui::TextColored(ImColor(kNaNColor), "non-finite at step %lld",
                         static_cast<long long>(run.first_nonfinite_step()));
    }
    ImGui::Unindent(26);
    ImGui::PopID();
  }

  ImGui::Spacing();
  ImGui::TextUnformatted("Snapshots");
  if (model.snapshots.empty()) ImGui::TextDisabled("(none)");
  for (size_t i = 0; i < model.snapshots.size(); ++i) {
    const SnapshotEntry& entry = model.snapshots[i];
    if (!entry.summary) continue;  // listed under Errors
    ImGui::PushID(int(i));
    const std::string label = "step " + std::to_string(entry.summary->step) + ": " + birth_line(*entry.summary);
    if (ImGui::Selectable(label.c_str(), ui.selected_snapshot == int(i))) {
      ui.selected_snapshot = int(i);
      ui.tab = Tab::snapshot;
      ui.select_tab = true;
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", entry.path.c_str());
    ImGui::PopID();
  }

  if (!model.errors().empty()) {
    ImGui::Spacing();
    ImGui::TextColored(ImColor(kErrorText), "Errors");
    ImGui::PushStyleColor(ImGuiCol_Text, ImColor(kErrorText).Value);
    for (const std::string& error : model.errors()) ImGui::TextWrapped("%s", error.c_str());
    ImGui::PopStyleColor();
  }
}

}  // namespace nanscope::viewer
