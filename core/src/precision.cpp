#include "nanscope/core/precision.hpp"

namespace nanscope {

const char* amp_name(Amp amp) { return amp == Amp::fp32 ? "off" : format::to_string(amp); }

std::optional<Amp> parse_amp(const std::string& text) {
  if (text == "off") return Amp::fp32;
  return format::from_string<format::Precision>(text);
}

}  // namespace nanscope
