#include "nanscope/common/number_text.hpp"

#include <charconv>
#include <cmath>

namespace nanscope {

namespace {

// %g with `digits` significant digits, as a default stream writes it, but
// through to_chars: no locale (a program's std::locale::global cannot turn
// 0.5 into "0,5"), and no iostream facets, which a Python extension built
// against a PyTorch wheel could not use safely (seen crashing in num_put).
std::string general(double value, int digits) {
  if (std::isnan(value)) return std::signbit(value) ? "-nan" : "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::general, digits);
  return error == std::errc() ? std::string(buffer, end) : std::string("?");
}

}  // namespace

std::string number_text(double value) { return general(value, 6); }

std::string seconds_text(double seconds) { return general(seconds, 2) + " s"; }

}  // namespace nanscope
