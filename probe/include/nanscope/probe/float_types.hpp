#pragma once
// The 16-bit floating types: what a model loaded in bf16 or fp16 holds its
// own weights in, and what an fp32 re-run or region widens.
#include <c10/core/ScalarType.h>

namespace nanscope::probe {

inline bool is_16bit_float(c10::ScalarType type) { return type == c10::kHalf || type == c10::kBFloat16; }

}  // namespace nanscope::probe
