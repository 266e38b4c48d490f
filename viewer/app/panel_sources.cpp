#include <imgui.h>

#include <algorithm>
#include <string>

#include "nanscope/viewer/colormap.hpp"
#include "panels.hpp"
#include "plot_widget.hpp"

namespace nanscope::viewer {

namespace {

constexpr uint32_t kErrorText = rgba(255, 110, 110);

// format::birth_text of the snapshot's first birth, or why there is none.
std::string birth_line(const format::SnapshotSummary& s) {
  if (!s.capture.first_birth) return s.capture.reproduced ? "no birth recorded" : "did not reproduce";
  return format::birth_text(*s.capture.first_birth);
}

// The run's early warnings, rollbacks, remedies, refused saves, dooming steps and stop: a
// count, and each one's text in a list that opens.
void draw_sentinel_events(const RunSource& run) {
  const std::vector<format::RunEvent>& events = run.sentinel_events();
  if (events.empty()) return;
  size_t warnings = 0, rollbacks = 0, remedies = 0, refused = 0, dooms = 0, stops = 0;
  for (const auto& e : events) {
    warnings += e.kind == format::EventKind::warning;
    rollbacks += e.kind == format::EventKind::rollback;
    remedies += e.kind == format::EventKind::remedy;
    refused += e.kind == format::EventKind::save_refused;
    dooms += e.kind == format::EventKind::doom;
    stops += e.kind == format::EventKind::stop;
  }
  const std::string label = std::to_string(warnings) + " warning(s), " + std::to_string(rollbacks) + " rollback(s)" +
                            (remedies ? ", " + std::to_string(remedies) + " remedy(ies)" : std::string()) +
                            (refused ? ", " + std::to_string(refused) + " save(s) refused" : std::string()) +
                            (dooms ? ", " + std::to_string(dooms) + " dooming step search(es)" : std::string()) +
                            (stops ? ", stopped" : "");
  ImGui::PushStyleColor(ImGuiCol_Text, ImColor(event_color(events.front().kind)).Value);
  const bool open = ImGui::TreeNode("sentinel", "%s", label.c_str());
  ImGui::PopStyleColor();
  if (!open) return;
  for (const auto& e : events)
    ImGui::TextColored(ImColor(event_color(e.kind)), "%lld %s: %s", static_cast<long long>(e.step),
                       format::to_string(e.kind), e.text.c_str());
  ImGui::TreePop();
}

// One run's line: shown or not, its colour, whether the heatmap and the
// table show it, its size, live growth and first non-finite step.
void draw_run_row(const ViewModel& model, UiState& ui, size_t i, const std::string& name) {
  const RunSource& run = model.runs[i];
  ImGui::PushID(int(i));
  bool visible = ui.run_visible[i];
  if (ImGui::Checkbox("##visible", &visible)) ui.run_visible[i] = visible;
  ImGui::SameLine();
  ImGui::ColorButton("##color", ImColor(run_color(i)), ImGuiColorEditFlags_NoTooltip, {14, 14});
  ImGui::SameLine();
  if (ImGui::RadioButton(name.c_str(), ui.active_run == int(i))) {
    ui.active_run = int(i);
    ui.layer_rows_built_for = SIZE_MAX;
    ui.selected_layer = -1;
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("%s (%s)\nthe heatmap and the layer table show this run", run.label().c_str(),
                      run.path().c_str());
  const format::RunData& data = run.data();
  ImGui::Indent(26);
  ImGui::TextDisabled("%zu steps, %zu layers", data.rows(), data.layer_names.size());
  if (run.overview()) {
    // A long run is drawn from its overview: say so, and when it had to be built.
    ImGui::SameLine();
    ImGui::TextDisabled(run.overview()->built_from_rows ? "(overview built from rows: an older file)"
                                                        : "(drawn from its overview)");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "per block of 64 steps and up: each series' min, max and NaN/Inf count;\n"
          "zoomed in, the steps' own rows are read");
  }
  if (run.rows_since_open() > 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImColor(rgba(120, 220, 120)), "live: +%zu since opened", run.rows_since_open());
  }
  if (run.first_nonfinite_step() >= 0) {
    ImGui::TextColored(ImColor(kNaNColor), "non-finite at step %lld",
                       static_cast<long long>(run.first_nonfinite_step()));
  }
  draw_sentinel_events(run);
  ImGui::Unindent(26);
  ImGui::PopID();
}

// A multi-process run: its name, how many ranks, and which went non-finite first.
void draw_group_header(const ViewModel& model, const RankGroup& group) {
  ImGui::Text("%s: %zu of %d ranks", group.label.c_str(), group.runs.size(), group.world_size);
  if (group.first_nonfinite.known()) {
    std::string ranks;
    for (int rank : group.first_nonfinite.ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(rank);
    ImGui::TextColored(ImColor(kFirstNonfiniteRankColor), "first non-finite: rank%s %s @ step %lld",
                       group.first_nonfinite.ranks.size() > 1 ? "s" : "", ranks.c_str(),
                       static_cast<long long>(group.first_nonfinite.step));
    return;
  }
  const bool any_nonfinite = std::any_of(group.runs.begin(), group.runs.end(),
                                         [&](size_t run) { return model.runs[run].first_nonfinite_step() >= 0; });
  if (any_nonfinite)
    ImGui::TextDisabled("first non-finite rank: unknown (no readable %s event)",
                        format::to_string(format::EventKind::first_nonfinite));
}

}  // namespace

void draw_sources_panel(const ViewModel& model, UiState& ui) {
  ImGui::TextUnformatted("Runs");
  if (model.runs.empty()) ImGui::TextDisabled("(none)");
  for (size_t i = 0; i < model.runs.size(); ++i) {
    const RankGroup* group = model.group_of(i);
    if (!group) {
      draw_run_row(model, ui, i, model.runs[i].label());
      continue;
    }
    if (i != group->runs.front()) continue;  // drawn with its group
    ImGui::PushID(group);
    draw_group_header(model, *group);
    ImGui::Indent(12);
    for (size_t run : group->runs) draw_run_row(model, ui, run, "rank " + std::to_string(model.runs[run].rank()));
    ImGui::Unindent(12);
    ImGui::PopID();
  }

  ImGui::Spacing();
  ImGui::TextUnformatted("Snapshots");
  if (model.snapshots.empty()) ImGui::TextDisabled("(none)");
  for (size_t i = 0; i < model.snapshots.size(); ++i) {
    const SnapshotEntry& entry = model.snapshots[i];
    if (!entry.summary) continue;  // listed under Errors
    ImGui::PushID(int(i));
    // A rank's snapshot says which rank: each rank of a group may write one.
    const int rank = entry.run >= 0 ? model.runs[size_t(entry.run)].rank() : -1;
    const std::string label = (rank >= 0 ? "rank " + std::to_string(rank) + " " : std::string()) + "step " +
                              std::to_string(entry.summary->step) + ": " + birth_line(*entry.summary);
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
