#include "nanscope/core/precision.hpp"

namespace nanscope {

const char* amp_name(Amp amp) {
  switch (amp) {
    case Amp::off: return "off";
    case Amp::bf16: return "bf16";
    case Amp::fp16: return "fp16";
  }
  return "off";
}

const char* precision_name(Amp amp) { return amp == Amp::off ? "fp32" : amp_name(amp); }

std::optional<Amp> parse_amp(const std::string& text) {
  if (text == "off" || text == "fp32") return Amp::off;
  if (text == "bf16") return Amp::bf16;
  if (text == "fp16") return Amp::fp16;
  return std::nullopt;
}

}  // namespace nanscope
