#pragma once
// Colours as packed RGBA in Dear ImGui's IM_COL32 byte order (R in the low
// byte), so the model can fill textures and the app can draw with them as is.
#include <cstdint>

namespace nanscope::viewer {

constexpr uint32_t rgba(uint8_t r, uint8_t g, uint8_t b, uint8_t a = 255) {
  return uint32_t(r) | uint32_t(g) << 8 | uint32_t(b) << 16 | uint32_t(a) << 24;
}

// Non-finite cells and markers stand out from every colour of the map.
inline constexpr uint32_t kNaNColor = rgba(255, 0, 200);
inline constexpr uint32_t kInfColor = rgba(255, 40, 40);
inline constexpr uint32_t kMissingColor = rgba(0, 0, 0, 0);
// The frame and title of the rank that went non-finite first: red, drawn
// outside the heatmap so it never reads as an Inf cell.
inline constexpr uint32_t kFirstNonfiniteRankColor = rgba(255, 64, 64);

// A perceptually ordered map (viridis' endpoints and midpoints), t in [0, 1].
uint32_t colormap(float t);

// Positions values on a log10 scale between lo and hi (both > 0).
struct LogScale {
  double lo = 1e-3, hi = 1;
  // Widens an empty or inverted range to at least one decade.
  static LogScale spanning(double lo, double hi);
  float position(double value) const;  // 0 at lo, 1 at hi, clamped
  double value_at(float position) const;
};

// A heatmap cell's colour: the map for finite values, kNaNColor/kInfColor for
// non-finite ones, kMissingColor for NaN when NaN means "not recorded".
uint32_t heat_color(float value, const LogScale& scale, bool nan_is_missing);

// heat_color for a whole image: a 256-colour table and a fast log2 (error
// under 0.01 of an octave, far below one colour step), because libm's log and
// the interpolation per cell were most of a panning frame at 256 layers.
class HeatColorizer {
 public:
  HeatColorizer(const LogScale& scale, bool nan_is_missing);
  uint32_t operator()(float value) const;

 private:
  float log2_lo_, per_octave_;
  bool nan_is_missing_;
  uint32_t table_[256];
};

}  // namespace nanscope::viewer
