#include "nanscope/core/precision.hpp"

namespace nanscope {

const char* amp_name(Amp amp) { return amp == Amp::fp32 ? "off" : format::to_string(amp); }

}  // namespace nanscope
