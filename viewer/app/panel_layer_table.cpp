#include <imgui.h>

#include <cmath>

#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"
#include "plot_widget.hpp"

namespace nanscope::viewer {

namespace {

enum ColumnId { kName, kNorm, kGrowth, kActAbsmax, kHeadroom };

LayerSort sort_key(int column) {
  switch (column) {
    case kName: return LayerSort::name;
    case kGrowth: return LayerSort::growth;
    case kActAbsmax:
    case kHeadroom: return LayerSort::act_absmax;
    default: return LayerSort::norm;
  }
}

// nan_is_fault: a NaN here is a NaN the run produced, not "unknown".
void value_cell(double value, const char* format_for_finite, bool nan_is_fault = false) {
  ImGui::TableNextColumn();
  if (std::isnan(value) && nan_is_fault) {
    ImGui::TextColored(ImColor(kNaNColor), "nan");
  } else if (std::isnan(value)) {
    ImGui::TextDisabled("-");
  } else if (!std::isfinite(value)) {
    ImGui::TextColored(ImColor(kNaNColor), "%s", value > 0 ? "inf" : "-inf");
  } else {
    ImGui::Text(format_for_finite, value);
  }
}

}  // namespace

void draw_layer_table_panel(const ViewModel& model, UiState& ui) {
  ImGui::TextUnformatted("Layers");
  if (ui.active_run < 0 || size_t(ui.active_run) >= model.runs.size()) return;
  const format::RunData& data = model.runs[ui.active_run].data();
  if (data.layer_names.empty()) {
    ImGui::TextDisabled("no per-layer data");
    return;
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  int window = int(ui.layer_window);
  if (ImGui::InputInt("growth over K steps", &window, 10)) {
    ui.layer_window = size_t(std::max(2, window));
    ui.layer_rows_built_for = SIZE_MAX;
  }

  bool resort = false;
  if (ui.layer_rows_built_for != data.rows()) {  // new rows, another run, another K
    const RunSource& run = model.runs[ui.active_run];
    if (run.overview())
      layer_rows(data, *run.overview(), ui.layer_window, ui.layer_rows);
    else
      layer_rows(data, ui.layer_window, ui.layer_rows);
    ui.layer_rows_built_for = data.rows();
    resort = true;
  }
  constexpr ImGuiTableFlags flags = ImGuiTableFlags_Sortable | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                    ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable |
                                    ImGuiTableFlags_SizingStretchProp;
  if (!ImGui::BeginTable("layers", 5, flags)) return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("layer", ImGuiTableColumnFlags_WidthStretch, 2.2f, kName);
  ImGui::TableSetupColumn("norm", ImGuiTableColumnFlags_DefaultSort | ImGuiTableColumnFlags_PreferSortDescending, 1.0f,
                          kNorm);
  ImGui::TableSetupColumn("growth", ImGuiTableColumnFlags_PreferSortDescending, 1.0f, kGrowth);
  ImGui::TableSetupColumn("act max", ImGuiTableColumnFlags_PreferSortDescending, 1.0f, kActAbsmax);
  ImGui::TableSetupColumn("fp16 bits", ImGuiTableColumnFlags_PreferSortAscending, 0.9f, kHeadroom);
  ImGui::TableHeadersRow();
  if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs()) {
    if (specs->SpecsDirty && specs->SpecsCount > 0) {
      ui.layer_sort_column = int(specs->Specs[0].ColumnUserID);
      ui.layer_sort_descending = specs->Specs[0].SortDirection == ImGuiSortDirection_Descending;
      // Least headroom is the largest abs-max: sort that column the other way round.
      if (ui.layer_sort_column == kHeadroom) ui.layer_sort_descending = !ui.layer_sort_descending;
      specs->SpecsDirty = false;
      resort = true;
    }
  }
  if (resort) sort_layer_rows(ui.layer_rows, data, sort_key(ui.layer_sort_column), ui.layer_sort_descending);

  ImGuiListClipper clipper;
  clipper.Begin(int(ui.layer_rows.size()));
  while (clipper.Step()) {
    for (int r = clipper.DisplayStart; r < clipper.DisplayEnd; ++r) {
      const LayerRow& row = ui.layer_rows[r];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      const std::string& name = data.layer_names[row.layer];
      ImGui::PushID(int(row.layer));
      if (ImGui::Selectable(name.empty() ? "(root)" : name.c_str(), ui.selected_layer == int(row.layer),
                            ImGuiSelectableFlags_SpanAllColumns))
        ui.selected_layer = int(row.layer);
      if (row.warning_event >= 0) {
        // Early warnings that named the layer: a mark, and the latest on hover.
        const format::RunEvent& warning = data.events[size_t(row.warning_event)];
        ImGui::SameLine();
        ImGui::TextColored(ImColor(event_color(warning.kind)), "(!)");
        if (ImGui::IsItemHovered())
          ImGui::SetTooltip("step %lld: %s", static_cast<long long>(warning.step), warning.text.c_str());
      }
      ImGui::PopID();
      value_cell(row.last_norm, "%.3g", /*nan_is_fault=*/true);
      value_cell(row.growth, "x%.2f");
      value_cell(row.act_absmax, "%.3g");
      value_cell(row.fp16_headroom_bits(), "%.1f");
    }
  }
  ImGui::EndTable();
}

}  // namespace nanscope::viewer
