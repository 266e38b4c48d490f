#include "plot_widget.hpp"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "nanscope/format/event_text.hpp"
#include "nanscope/viewer/colormap.hpp"

namespace nanscope::viewer {

namespace {

constexpr float kLeftMargin = 58, kBottomMargin = 16, kRightMargin = 8, kTopMargin = 6;
constexpr uint32_t kBackground = rgba(22, 24, 28);
constexpr uint32_t kGrid = rgba(255, 255, 255, 28);
constexpr uint32_t kAxisText = rgba(190, 190, 190);
constexpr uint32_t kCursor = rgba(255, 255, 255, 90);
constexpr uint32_t kRolledBack = rgba(140, 140, 150, 55);

// Maps steps and values (in axis units) to pixels inside `inner`.
struct Mapping {
  ImVec2 lo, hi;  // the plot area
  AxisRange x, y;
  bool log_y;
  float px(double step) const { return lo.x + float((step - x.lo) / x.span()) * (hi.x - lo.x); }
  float py_units(double u) const { return hi.y - float((u - y.lo) / y.span()) * (hi.y - lo.y); }
  float py(double value) const { return py_units(log_y ? std::log10(value) : value); }
  double step_at(float pixel_x) const { return x.lo + double(pixel_x - lo.x) / (hi.x - lo.x) * x.span(); }
};

void draw_axes(ImDrawList* dl, const Mapping& m) {
  static std::vector<double> ticks;  // reused: no allocation once grown
  char label[32];
  const float width = m.hi.x - m.lo.x, height = m.hi.y - m.lo.y;
  linear_ticks(m.x, std::max(2, int(width / 90)), ticks);
  for (double t : ticks) {
    const float x = m.px(t);
    dl->AddLine({x, m.lo.y}, {x, m.hi.y}, kGrid);
    std::snprintf(label, sizeof label, "%.0f", t);
    dl->AddText({x - ImGui::CalcTextSize(label).x * 0.5f, m.hi.y + 1}, kAxisText, label);
  }
  if (m.log_y)
    log_ticks(m.y, std::max(2, int(height / 24)), ticks);
  else
    linear_ticks(m.y, std::max(2, int(height / 24)), ticks);
  for (double t : ticks) {
    const float y = m.py_units(t);
    dl->AddLine({m.lo.x, y}, {m.hi.x, y}, kGrid);
    format_value(m.log_y ? std::pow(10.0, t) : t, label, sizeof label);
    const ImVec2 size = ImGui::CalcTextSize(label);
    dl->AddText({m.lo.x - size.x - 4, y - size.y * 0.5f}, kAxisText, label);
  }
}

// Lines through each column's first, min, max and last value; non-finite
// columns get a marker at the top edge and a faint band.
void draw_line(ImDrawList* dl, const Mapping& m, const std::vector<Column>& columns, uint32_t color,
               std::vector<float>& points) {
  points.clear();
  const float column_width = (m.hi.x - m.lo.x) / float(std::max<size_t>(1, columns.size()));
  for (size_t c = 0; c < columns.size(); ++c) {
    const Column& col = columns[c];
    const float x = m.lo.x + (float(c) + 0.5f) * column_width;
    if (col.nonfinite) {
      const uint32_t marker = (col.nonfinite & kNaN) ? kNaNColor : kInfColor;
      dl->AddRectFilled({x - column_width * 0.5f, m.lo.y}, {x + column_width * 0.5f + 1, m.hi.y},
                        (marker & 0x00FFFFFF) | (60u << 24));
      dl->AddTriangleFilled({x - 4, m.lo.y}, {x + 4, m.lo.y}, {x, m.lo.y + 7}, marker);
    }
    if (col.count == 0) continue;
    for (double v : {col.first, col.min, col.max, col.last}) {
      points.push_back(x);
      points.push_back(m.py(v));
    }
  }
  if (points.size() >= 4)
    dl->AddPolyline(reinterpret_cast<const ImVec2*>(points.data()), int(points.size() / 2), color, 0, 1.5f);
}

}  // namespace

uint32_t event_color(format::EventKind kind) {
  using format::EventKind;
  switch (kind) {
    case EventKind::skip: return rgba(255, 200, 60);
    case EventKind::scale_backoff: return rgba(120, 200, 255);
    case EventKind::fallback: return rgba(255, 120, 40);
    case EventKind::snapshot: return rgba(200, 140, 255);
    case EventKind::first_birth: return kNaNColor;
    case EventKind::warning: return rgba(255, 225, 80);
    case EventKind::rollback: return rgba(90, 230, 200);
    case EventKind::stop: return rgba(255, 60, 60);
    case EventKind::remedy: return rgba(255, 160, 90);
    case EventKind::save_refused: return rgba(255, 90, 160);
    case EventKind::doom: return rgba(255, 40, 200);
    case EventKind::first_nonfinite:
    case EventKind::nonfinite_ranks: return kFirstNonfiniteRankColor;
    case EventKind::snapshot_failed:
    case EventKind::snapshot_skipped:
    case EventKind::dist_error:
    case EventKind::resume:
    case EventKind::empty_loss:
    case EventKind::unknown: break;
  }
  return rgba(200, 200, 200);
}

namespace {

// Every line decimated to one column per pixel over the visible steps, and
// the y axis fitted to them (and the reference lines) unless set by hand.
void decimate_and_fit(const PlotSpec& spec, const StepView& steps, float inner_width, PlotState& state) {
  state.columns.resize(spec.lines.size());
  const DecimateOptions base{false, state.log_y};
  for (size_t i = 0; i < spec.lines.size(); ++i) {
    const PlotLine& line = spec.lines[i];
    DecimateOptions options = base;
    options.nan_is_missing = line.nan_is_missing;
    options.left_out = line.left_out;
    decimate_series(line.steps, line.values, line.blocks, steps.x.lo, steps.x.hi, size_t(inner_width), state.columns[i],
                    options);
  }
  if (state.auto_y) {
    AxisRange fit{0, 0};
    bool any = false;
    for (const auto& columns : state.columns) {
      const AxisRange r = fit_columns(columns, state.log_y, {NAN, NAN});
      if (std::isnan(r.lo)) continue;
      fit = any ? AxisRange{std::min(fit.lo, r.lo), std::max(fit.hi, r.hi)} : r;
      any = true;
    }
    for (const ReferenceLine& ref : spec.references) {
      if (ref.value > 1e30) continue;  // a far-off limit (bf16) is labelled, not fitted
      const double u = state.log_y ? std::log10(ref.value) : ref.value;
      fit = any ? including(fit, u) : AxisRange{u, u};
      any = true;
    }
    state.y = any ? padded(fit, 0.02) : AxisRange{0, 1};
  }
}

// Zoom and pan the shared step axis (and y on request) with the mouse.
void interact(const Mapping& m, AxisRange step_extent, bool hovered, bool dragging, StepView& steps, PlotState& state) {
  const ImVec2 lo = m.lo, hi = m.hi;
  const float inner_width = std::max(1.0f, hi.x - lo.x);
  const ImGuiIO& io = ImGui::GetIO();
  const AxisRange zoom_extent{step_extent.lo - 0.05 * step_extent.span(), step_extent.hi + 0.05 * step_extent.span()};
  if (hovered && io.MouseWheel != 0) {
    const double factor = std::pow(0.85, double(io.MouseWheel));
    if (io.KeyShift) {
      const double anchor = state.y.lo + double(hi.y - io.MousePos.y) / (hi.y - lo.y) * state.y.span();
      state.y = zoomed(state.y, anchor, factor);
      state.auto_y = false;
    } else {
      steps.x = clamped(zoomed(steps.x, m.step_at(io.MousePos.x), factor), zoom_extent, 4.0);
      steps.follow = false;
    }
  }
  if (dragging) {
    const double dx = double(io.MouseDelta.x) / inner_width * steps.x.span();
    steps.x = clamped({steps.x.lo - dx, steps.x.hi - dx}, zoom_extent, 4.0);
    steps.follow = false;
    if (!state.auto_y) {
      const double dy = double(io.MouseDelta.y) / (hi.y - lo.y) * state.y.span();
      state.y = {state.y.lo + dy, state.y.hi + dy};
    }
  }
  if (hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    steps.follow = true;
    state.auto_y = true;
  }
}

// The reference lines (a limit, a target), or how far above the view they are.
void draw_references(ImDrawList* dl, const PlotSpec& spec, const PlotState& state, const Mapping& m) {
  const ImVec2 lo = m.lo, hi = m.hi;
  for (const ReferenceLine& ref : spec.references) {
    const double u = state.log_y ? std::log10(ref.value) : ref.value;
    char text[64];
    if (state.y.contains(u)) {
      const float y = m.py_units(u);
      dl->AddLine({lo.x, y}, {hi.x, y}, ref.color, 1.0f);
      std::snprintf(text, sizeof text, "%s", ref.label);
      const float label_y = y - 15 < lo.y ? y + 2 : y - 15;  // below the line at the top edge
      dl->AddText({hi.x - ImGui::CalcTextSize(text).x - 4, label_y}, ref.color, text);
    } else if (u > state.y.hi) {
      std::snprintf(text, sizeof text, "%s: %.1f decades above", ref.label, u - state.y.hi);
      dl->AddText({lo.x + 4, lo.y + 2}, ref.color, text);  // left: the right corner labels in-range lines
    }
  }
}

// The runs' events: a marker at each step, rolled-back steps greyed out, a
// dooming step linked to the step it doomed.
void draw_event_markers(ImDrawList* dl, const PlotSpec& spec, const StepView& steps, const Mapping& m) {
  const ImVec2 lo = m.lo, hi = m.hi;
  for (const auto* events : spec.markers) {
    for (const format::RunEvent& e : *events) {
      // A rollback greys out the steps it took back: they are not the run's curve.
      if (e.kind == format::EventKind::rollback)
        if (const std::optional<int64_t> to = format::rollback_target(e.text)) {
          const float x0 = std::max(lo.x, m.px(double(*to) + 1)), x1 = std::min(hi.x, m.px(double(e.step) + 1));
          if (x1 > x0) dl->AddRectFilled({x0, lo.y}, {x1, hi.y}, kRolledBack);
        }
      // A dooming step is linked to the step it doomed: a bracket along the top, an arrow at the failing step.
      if (e.kind == format::EventKind::doom)
        if (const std::optional<int64_t> doomed = format::doomed_step(e.text); doomed && *doomed > e.step) {
          const float x0 = m.px(double(e.step) + 0.5), x1 = m.px(double(*doomed) + 0.5), y = lo.y + 12;
          const uint32_t link = event_color(e.kind);
          dl->AddLine({x0, y}, {x1, y}, link, 2.0f);
          dl->AddLine({x0, y}, {x0, y + 8}, link, 2.0f);
          dl->AddTriangleFilled({x1, y + 9}, {x1 - 5, y + 1}, {x1 + 5, y + 1}, link);
        }
      if (!steps.x.contains(double(e.step))) continue;
      const float x = m.px(double(e.step) + 0.5);
      const uint32_t color = event_color(e.kind);
      dl->AddLine({x, lo.y}, {x, hi.y}, (color & 0x00FFFFFF) | (110u << 24));
      dl->AddQuadFilled({x, hi.y - 9}, {x + 4, hi.y - 5}, {x, hi.y - 1}, {x - 4, hi.y - 5}, color);
    }
  }
}

// The hover read-out: the step under the cursor, each line's value, nearby events.
void draw_hover(ImDrawList* dl, const PlotSpec& spec, const StepView& steps, const Mapping& m) {
  const ImVec2 lo = m.lo, hi = m.hi;
  const ImGuiIO& io = ImGui::GetIO();
  const float inner_width = std::max(1.0f, hi.x - lo.x);
  if (io.MousePos.x >= lo.x && io.MousePos.x <= hi.x) {
    const double step = std::floor(m.step_at(io.MousePos.x));
    dl->AddLine({io.MousePos.x, lo.y}, {io.MousePos.x, hi.y}, kCursor);
    ImGui::BeginTooltip();
    ImGui::Text("step %.0f", step);
    char value[32];
    for (const PlotLine& line : spec.lines) {
      const size_t i = first_at_or_after(line.steps, line.values.count, step);
      if (i >= line.values.count || double(line.steps[i]) != step) continue;
      format_value(line.values[i], value, sizeof value);
      ImGui::TextColored(ImColor(line.color), "%s: %s", line.label, value);
    }
    const double pixel_steps = steps.x.span() / inner_width;
    for (const auto* events : spec.markers) {
      for (const format::RunEvent& e : *events)
        if (std::abs(double(e.step) + 0.5 - m.step_at(io.MousePos.x)) <= 4 * pixel_steps + 0.5)
          ImGui::TextColored(ImColor(event_color(e.kind)), "step %lld %s: %s", static_cast<long long>(e.step),
                             format::to_string(e.kind), e.text.c_str());
    }
    ImGui::EndTooltip();
  }
}

}  // namespace

Region draw_plot(const PlotSpec& spec, float width, float height, StepView& steps, AxisRange step_extent,
                 PlotState& state) {
  ImGui::PushID(spec.title);
  ImGui::TextUnformatted(spec.title);
  if (spec.allow_log) {
    ImGui::SameLine();
    ImGui::Checkbox("log", &state.log_y);
  }
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float canvas_height = std::max(40.0f, height - ImGui::GetFrameHeightWithSpacing());
  ImGui::InvisibleButton("canvas", {width, canvas_height});
  const bool hovered = ImGui::IsItemHovered();
  const bool dragging = ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 lo{origin.x + kLeftMargin, origin.y + kTopMargin};
  const ImVec2 hi{origin.x + width - kRightMargin, origin.y + canvas_height - kBottomMargin};
  const float inner_width = std::max(1.0f, hi.x - lo.x);

  decimate_and_fit(spec, steps, inner_width, state);
  const Mapping m{lo, hi, steps.x, state.y, state.log_y};

  interact(m, step_extent, hovered, dragging, steps, state);
  dl->AddRectFilled({origin.x, origin.y}, {origin.x + width, origin.y + canvas_height}, kBackground);
  draw_axes(dl, m);
  dl->PushClipRect(lo, hi, true);
  draw_references(dl, spec, state, m);
  draw_event_markers(dl, spec, steps, m);
  for (size_t i = 0; i < spec.lines.size(); ++i) draw_line(dl, m, state.columns[i], spec.lines[i].color, state.points);
  dl->PopClipRect();

  if (hovered && !dragging) draw_hover(dl, spec, steps, m);
  ImGui::PopID();
  return {lo.x, lo.y, hi.x - lo.x, hi.y - lo.y};
}

}  // namespace nanscope::viewer
