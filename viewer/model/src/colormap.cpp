#include "nanscope/viewer/colormap.hpp"

#include <algorithm>
#include <cmath>

namespace nanscope::viewer {

uint32_t colormap(float t) {
  // viridis sampled at 0, 1/8, ..., 1
  static constexpr uint8_t stops[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                          {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                          {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
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

}  // namespace nanscope::viewer
