#pragma once
// The layer table: each layer's latest grad norm, its growth over the last K
// steps, its activation headroom, and the latest early warning that named it,
// sortable by any of the numbers.
#include <cstddef>
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_overview.hpp"

namespace nanscope::viewer {

inline constexpr double kFp16Max = format::largest_finite(format::Precision::fp16);
inline constexpr double kBf16Max = 3.3895313892515355e38;

struct LayerRow {
  size_t layer = 0;
  double last_norm = 0;        // the latest recorded grad norm (NaN/Inf kept)
  double growth = 0;           // last / first finite norm within the window; NaN when unknown
  double act_absmax = 0;       // the largest recorded activation magnitude; NaN when none
  bool nonfinite = false;      // a non-finite norm within the window
  int64_t warning_event = -1;  // index into the run's events of the latest warning naming this layer; -1 none
  // log2(65504 / act_absmax): bits left before fp16 overflows; NaN when unknown.
  double fp16_headroom_bits() const;
};

enum class LayerSort { name, norm, growth, act_absmax };

// One row per layer over the last `window` steps of `run`. Reuses `out`.
void layer_rows(const format::RunData& run, size_t window, std::vector<LayerRow>& out);
// The same for a long run, whose per-layer rows are not in memory: from its
// overview's finest blocks (64 steps each). The window is rounded out to
// whole blocks, and growth is the window's last finite norm over the last
// value before it; the latest norm, the NaN/Inf mark and the abs-max are
// exact.
void layer_rows(const format::RunData& run, const format::RunOverview& overview, size_t window,
                std::vector<LayerRow>& out);
// Orders rows; non-finite norms and growths count as the largest values, so a
// layer that went NaN heads a descending table.
void sort_layer_rows(std::vector<LayerRow>& rows, const format::RunData& run, LayerSort key, bool descending);

}  // namespace nanscope::viewer
