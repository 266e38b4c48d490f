#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "nanscope/format/precision_trail.hpp"
#include "nanscope/format/snapshot_inventory.hpp"
#include "nanscope/viewer/colormap.hpp"
#include "nanscope/viewer/snapshot_text.hpp"
#include "panels.hpp"

namespace nanscope::viewer {

namespace {

constexpr uint32_t kHeading = rgba(240, 200, 120);
constexpr uint32_t kCodeWarning = rgba(255, 150, 60);
// The precision trail's ulps bars: within the type's rounding, and past it.
constexpr uint32_t kWithinRounding = rgba(110, 150, 200);
constexpr uint32_t kPrecisionLost = rgba(255, 220, 40);

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s + "]";
}

void stats_cells(const format::TensorStats& t) {
  ImGui::TableNextColumn();
  ImGui::Text("%s %s", t.dtype.c_str(), shape_text(t.shape).c_str());
  char v[32];
  for (double x : {t.min, t.max, t.absmax}) {
    ImGui::TableNextColumn();
    format_value(x, v, sizeof v);
    ImGui::TextUnformatted(v);
  }
  for (int64_t n : {t.nan_count, t.inf_count}) {
    ImGui::TableNextColumn();
    if (n > 0)
      ImGui::TextColored(ImColor(kNaNColor), "%lld", static_cast<long long>(n));
    else
      ImGui::TextDisabled("0");
  }
}

void stats_headers() {
  for (const char* h : {"output", "min", "max", "|max|", "nan", "inf"}) ImGui::TableSetupColumn(h);
}

void births_table(const format::Capture& capture) {
  const std::pair<const char*, const std::optional<format::Birth>*> rows[] = {{"first", &capture.first_birth},
                                                                              {"first NaN", &capture.first_nan_birth},
                                                                              {"first Inf", &capture.first_inf_birth}};
  if (!ImGui::BeginTable("births", 12,
                         ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit))
    return;
  for (const char* h : {"birth", "op", "phase", "module", "backward node", "forward op"}) ImGui::TableSetupColumn(h);
  stats_headers();
  ImGui::TableHeadersRow();
  for (const auto& [label, birth] : rows) {
    if (!birth->has_value()) continue;
    const format::Birth& b = **birth;
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextColored(ImColor(b.kind == format::BirthKind::nan ? kNaNColor : kInfColor), "%s (%s)", label,
                       format::to_string(b.kind));
    const std::string phase = format::to_string(b.op.phase);
    for (const std::string* s : {&b.op.op, &phase, &b.op.module, &b.op.backward_node, &b.op.forward_op}) {
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(s->empty() ? "-" : s->c_str());
    }
    stats_cells(b.op.output);
  }
  ImGui::EndTable();
}

void inputs_table(const format::Birth& birth) {
  if (birth.inputs.empty() || !ImGui::BeginTable("inputs", 7, ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit))
    return;
  ImGui::TableSetupColumn("input");
  stats_headers();
  ImGui::TableHeadersRow();
  for (size_t i = 0; i < birth.inputs.size(); ++i) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::Text("%zu", i);
    stats_cells(birth.inputs[i]);
  }
  ImGui::EndTable();
}

void trail_table(const format::Capture& capture) {
  const int64_t birth_index = capture.first_birth ? capture.first_birth->op.index : -1;
  if (!ImGui::BeginTable("trail", 10,
                         ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit |
                             ImGuiTableFlags_ScrollY,
                         {0, 260}))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  for (const char* h : {"#", "op", "phase", "module"}) ImGui::TableSetupColumn(h);
  stats_headers();
  ImGui::TableHeadersRow();
  for (const format::OpRecord& op : capture.trail) {
    ImGui::TableNextRow();
    if (op.index == birth_index)
      ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, (kNaNColor & 0x00FFFFFF) | (90u << 24));
    ImGui::TableNextColumn();
    ImGui::Text("%lld", static_cast<long long>(op.index));
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(op.op.c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(format::to_string(op.phase));
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(op.module.empty() ? "(root)" : op.module.c_str());
    stats_cells(op.output);
  }
  ImGui::EndTable();
}

// The sample the fault came from (snapshot_text.hpp): the input birth's row,
// the rows the birth op made non-finite, replay's batch bisection.
void offending_sample(const format::SnapshotSummary& s) {
  ImGui::TextColored(ImColor(kHeading), "Offending sample");
  const std::vector<std::string> lines = offending_sample_lines(s);
  if (lines.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("not traced to one sample (batch of %zu rows, inputs %s %s)", s.batch_rows.size(),
                        s.input_dtype.c_str(), shape_text(s.input_shape).c_str());
    return;
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) ImGui::SameLine();
    ImGui::TextWrapped("%s", lines[i].c_str());
  }
}

void replay_box(const format::SnapshotSummary& s, UiState& ui) {
  ImGui::TextColored(ImColor(kHeading), "Replay");
  if (!s.replay) {
    ImGui::SameLine();
    ImGui::TextDisabled("not replayed yet: nanscope-replay %s", s.path.c_str());
  }
  // A TorchScript program or a pickled batch object is code the file chose:
  // said where a user decides to replay (snapshot_inventory.hpp).
  if (format::carries_code(s)) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImColor(kCodeWarning).Value);
    ImGui::TextWrapped("%s", format::replay_runs_text(s).c_str());
    ImGui::PopStyleColor();
    const ImVec2 min = ImGui::GetItemRectMin(), max = ImGui::GetItemRectMax();
    ui.regions["snapshot.code_warning"] = {min.x, min.y, max.x - min.x, max.y - min.y};
  }
  if (!s.replay) return;
  const format::ReplayRecord& r = *s.replay;
  ImGui::SameLine();
  ImGui::Text("verdict: %s   category: %s", format::to_string(r.verdict), format::to_string(r.category));
  ImGui::TextWrapped("suggestion: %s", r.suggestion.c_str());
  ImGui::TextWrapped("%s", replay_reruns_line(s).c_str());
  if (!r.fp32_modules.empty()) ImGui::Text("fp32 needed in: %s", r.fp32_modules.c_str());
  if (r.kernel_trials) {
    ImGui::TextWrapped("other kernels of %s: %s", r.kernel_trials->op.c_str(),
                       format::kernel_trials_text(*r.kernel_trials).c_str());
    const ImVec2 min = ImGui::GetItemRectMin(), max = ImGui::GetItemRectMax();
    ui.regions["snapshot.kernels"] = {min.x, min.y, max.x - min.x, max.y - min.y};
  }
  if (!r.anomaly.empty()) ImGui::TextWrapped("anomaly mode: %s", r.anomaly.c_str());
}

// A precision verdict's ops against fp32 (format/precision_trail.hpp): each
// op's error in ulps of the low type as a bar on a log scale, past the margin
// in its own colour, the first such op (where precision was lost) marked.
void precision_trail_box(const format::SnapshotSummary& s, UiState& ui) {
  if (!s.replay || !s.replay->precision_trail) return;
  const format::PrecisionTrail& t = *s.replay->precision_trail;
  ImGui::TextColored(ImColor(kHeading), "Precision trail: %zu ops against fp32, errors in ulps of %s (past %g: lost)",
                     t.ops.size(), t.type.c_str(), t.margin_ulps);
  ImGui::TextWrapped("precision lost: %s", format::precision_lost_text(t).c_str());
  if (t.ops.empty() || !ImGui::BeginTable("precision_trail", 8,
                                          ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                                              ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_ScrollY,
                                          {0, 200}))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  for (const char* h : {"#", "op", "phase", "module", "ulps", "", "max abs", "max rel"}) ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  double top = 1;
  for (const format::OpError& e : t.ops)
    if (std::isfinite(e.ulps)) top = std::max(top, e.ulps);
  const float bar_width = 120;
  char v[32];
  // Opened on the op where precision was lost, with a few ops before it.
  if (ui.trail_scrolled_for != s.path) {
    ui.trail_scrolled_for = s.path;
    const float row = ImGui::GetTextLineHeight() + 2 * ImGui::GetStyle().CellPadding.y;
    ImGui::SetScrollY(row * float(std::max<int64_t>(0, t.first_lost - 3)));
  }
  ImGuiListClipper clipper;
  clipper.Begin(int(t.ops.size()));
  while (clipper.Step()) {
    for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) {
      const format::OpError& e = t.ops[size_t(i)];
      const bool lost = e.nonfinite > 0 || !(e.ulps <= t.margin_ulps);
      ImGui::TableNextRow();
      if (i == t.first_lost)
        ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, (kPrecisionLost & 0x00FFFFFF) | (60u << 24));
      ImGui::TableNextColumn();
      ImGui::Text("%lld", static_cast<long long>(e.op.index));
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(e.op.op.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(format::to_string(e.op.phase));
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(e.op.module.empty() ? "(root)" : e.op.module.c_str());
      ImGui::TableNextColumn();
      format_value(e.ulps, v, sizeof v);
      ImGui::TextUnformatted(v);
      ImGui::TableNextColumn();
      // log10(1 + ulps) against the largest finite one; a non-finite op fills the cell.
      const double share = std::isfinite(e.ulps) ? std::log10(1 + e.ulps) / std::log10(1 + top) : 1.0;
      const ImVec2 at = ImGui::GetCursorScreenPos();
      const float h = ImGui::GetTextLineHeight();
      const float length = std::max(2.0f, float(share) * bar_width);
      ImGui::GetWindowDrawList()->AddRectFilled({at.x, at.y + 2}, {at.x + length, at.y + h - 2},
                                                lost ? kPrecisionLost : kWithinRounding);
      ImGui::Dummy({bar_width, h});
      if (i == t.first_lost) ui.regions["snapshot.precision_lost"] = {at.x, at.y + 2, length, h - 4};
      if (i == 0) ui.regions["snapshot.precision_trail"] = {at.x, at.y, bar_width, h};
      for (double x : {e.max_abs, e.max_rel}) {
        ImGui::TableNextColumn();
        format_value(x, v, sizeof v);
        ImGui::TextUnformatted(v);
      }
    }
  }
  ImGui::EndTable();
}

// Horizontal bars of each layer's grad norm at the failing step (log scale).
void layer_bars(const format::SnapshotSummary& s, UiState& ui) {
  if (s.layer_grad_norm.empty()) return;
  ImGui::TextColored(ImColor(kHeading), "Grad norm per layer at this step");
  double lo = 0, hi = 0;
  for (float v : s.layer_grad_norm) {
    if (!std::isfinite(v) || v <= 0) continue;
    lo = lo == 0 ? v : std::min(lo, double(v));
    hi = std::max(hi, double(v));
  }
  const LogScale scale = LogScale::spanning(lo / 10, hi);
  const size_t n = s.layer_grad_norm.size();
  const float row = std::clamp(180.0f / float(n), 3.0f, 14.0f);
  const float width = ImGui::GetContentRegionAvail().x;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::Dummy({width, row * float(n)});
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float name_width = 170, bar_width = std::max(50.0f, width - name_width - 80);
  char value[32];
  for (size_t i = 0; i < n; ++i) {
    const float y = origin.y + row * float(i);
    const float v = s.layer_grad_norm[i];
    const float length = std::isfinite(v) ? std::max(2.0f, scale.position(v) * bar_width) : bar_width;
    dl->AddRectFilled({origin.x + name_width, y + 1}, {origin.x + name_width + length, y + row - 1},
                      heat_color(v, scale, false));
    if (row >= 11) {
      const std::string& name = i < s.layer_names.size() ? s.layer_names[i] : std::string();
      dl->AddText({origin.x, y - 1}, rgba(180, 180, 180), name.empty() ? "(root)" : name.c_str());
      format_value(v, value, sizeof value);
      dl->AddText({origin.x + name_width + length + 4, y - 1}, rgba(200, 200, 200), value);
    }
  }
  ui.regions["snapshot.layers"] = {origin.x + name_width, origin.y, bar_width, row * float(n)};
}

}  // namespace

void draw_snapshot_panel(const ViewModel& model, UiState& ui) {
  if (ui.selected_snapshot < 0 || size_t(ui.selected_snapshot) >= model.snapshots.size() ||
      !model.snapshots[ui.selected_snapshot].summary) {
    ui.selected_snapshot = -1;
    for (size_t i = 0; i < model.snapshots.size() && ui.selected_snapshot < 0; ++i)
      if (model.snapshots[i].summary) ui.selected_snapshot = int(i);
  }
  if (ui.selected_snapshot < 0) {
    ImGui::TextDisabled("No snapshot open. A run directory's snapshots/ are listed on the left.");
    return;
  }
  const format::SnapshotSummary& s = *model.snapshots[ui.selected_snapshot].summary;
  ImGui::Text("%s", s.path.c_str());
  ImGui::Text("step %lld   %s   loss scale %g   lr %g   clip %g   model %s", static_cast<long long>(s.step),
              format::step_precision_text(s).c_str(), s.loss_scale, s.lr, s.clip, s.model_name.c_str());
  if (s.capture.compiled_only || !s.capture.nonfinite_weights.empty())  // the capture's own words say where
    ImGui::TextColored(ImColor(kInfColor), "%s.", format::capture_text(s.capture).c_str());
  else if (!s.capture.reproduced)
    ImGui::TextColored(ImColor(kInfColor),
                       "The forensic re-run stayed finite: the fault did not reproduce (transient?).");
  ImGui::Spacing();
  replay_box(s, ui);
  ImGui::Spacing();
  precision_trail_box(s, ui);
  ImGui::Spacing();
  ImGui::TextColored(ImColor(kHeading), "Births");
  births_table(s.capture);
  ImGui::Spacing();
  offending_sample(s);
  ImGui::Spacing();
  layer_bars(s, ui);
  ImGui::Spacing();
  ImGui::TextColored(ImColor(kHeading), "Trail: the last %zu ops up to the first birth (%lld ops seen)",
                     s.capture.trail.size(), static_cast<long long>(s.capture.ops_seen));
  trail_table(s.capture);
  if (s.capture.first_birth && !s.capture.first_birth->inputs.empty()) {
    ImGui::TextColored(ImColor(kHeading), "Inputs of %s as they were when it ran",
                       s.capture.first_birth->op.op.c_str());
    inputs_table(*s.capture.first_birth);
  }
}

}  // namespace nanscope::viewer
