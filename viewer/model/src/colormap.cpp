#include "nanscope/viewer/colormap.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace nanscope::viewer {

uint32_t colormap(float t) {
  // viridis sampled at 0, 1/8, ..., 1
  static constexpr uint8_t stops[9][3] = {{68, 1, 84},    {71, 44, 122}, {59, 81, 139},  {44, 113, 142}, {33, 144, 141},
                                          {39, 173, 129}, {92, 200, 99}, {170, 220, 50}, {253, 231, 37}};
  if (!(t > 0)) t = 0;  // NaN too
  t = std::min(t, 1.0f) * 8.0f;
  const int i = std::min(7, int(t));
  const float f = t - float(i);
  auto mix = [&](int c) { return uint8_t(std::lround(stops[i][c] + f * (stops[i + 1][c] - stops[i][c]))); };
  return rgba(mix(0), mix(1), mix(2));
}

LogScale LogScale::spanning(double lo, double hi) {
  if (!(lo > 0) || !std::isfinite(lo)) lo = hi > 0 && std::isfinite(hi) ? hi / 10 : 1e-3;
  if (!(hi > lo) || !std::isfinite(hi)) hi = lo * 10;
  return {lo, hi};
}

float LogScale::position(double value) const {
  if (!(value > 0)) return 0;
  const double t = (std::log10(value) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  return float(std::clamp(t, 0.0, 1.0));
}

double LogScale::value_at(float position) const {
  return std::pow(10.0, std::log10(lo) + position * (std::log10(hi) - std::log10(lo)));
}

uint32_t heat_color(float value, const LogScale& scale, bool nan_is_missing) {
  if (std::isnan(value)) return nan_is_missing ? kMissingColor : kNaNColor;
  if (std::isinf(value)) return kInfColor;
  return colormap(scale.position(value));
}

namespace {
// log2 from the float's exponent plus a quadratic in its mantissa, exact at
// powers of two.
float fast_log2(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const float exponent = float(int((bits >> 23) & 255) - 127);
  bits = (bits & 0x7FFFFFu) | 0x3F800000u;
  float mantissa;
  std::memcpy(&mantissa, &bits, sizeof mantissa);
  const float f = mantissa - 1.0f;
  return exponent + f * (1.3465f - 0.3465f * f);
}
}  // namespace

HeatColorizer::HeatColorizer(const LogScale& scale, bool nan_is_missing)
    : log2_lo_(float(std::log2(scale.lo))),
      per_octave_(float(255.0 / (std::log2(scale.hi) - std::log2(scale.lo)))),
      nan_is_missing_(nan_is_missing) {
  for (int i = 0; i < 256; ++i) table_[i] = colormap(float(i) / 255.0f);
}

uint32_t HeatColorizer::operator()(float value) const {
  if (std::isnan(value)) return nan_is_missing_ ? kMissingColor : kNaNColor;
  if (std::isinf(value)) return kInfColor;
  if (!(value > 0)) return table_[0];
  const float index = (fast_log2(value) - log2_lo_) * per_octave_;
  return table_[index <= 0 ? 0 : index >= 255 ? 255 : int(index + 0.5f)];
}

}  // namespace nanscope::viewer
