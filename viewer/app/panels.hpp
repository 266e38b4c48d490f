#pragma once
// One panel per function (Dear ImGui's examples): each draws from the view
// model and the UI state and owns nothing else.
#include <cstdint>

#include "nanscope/viewer/view_model.hpp"
#include "ui_state.hpp"

namespace nanscope::viewer {

// The whole window: the sidebar and the Training / Snapshot tabs.
void draw_frame(const ViewModel& model, UiState& ui);

void draw_sources_panel(const ViewModel& model, UiState& ui);       // runs, snapshots, errors
void draw_layer_table_panel(const ViewModel& model, UiState& ui);   // sortable per-layer table
void draw_scalar_plots_panel(const ViewModel& model, UiState& ui);  // loss, scale, LR, grad norm
void draw_heatmap_panel(const ViewModel& model, UiState& ui);       // layer x step grad norms
void draw_layer_plots_panel(const ViewModel& model, UiState& ui);   // one layer's norm, act abs-max
void draw_snapshot_panel(const ViewModel& model, UiState& ui);      // births, trail, replay

// The colour of run `i` in every plot and legend.
uint32_t run_color(size_t i);
// Whether run `i` is drawn (the sidebar's checkboxes).
inline bool run_visible(const UiState& ui, size_t i) { return i >= ui.run_visible.size() || ui.run_visible[i]; }

}  // namespace nanscope::viewer
