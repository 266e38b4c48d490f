#pragma once
// The 16-bit floating types: what a model loaded in bf16 or fp16 holds its
// own weights in, and what an fp32 re-run or region widens.
#include <c10/core/ScalarType.h>

#include <string>

namespace nanscope::probe {

inline bool is_16bit_float(c10::ScalarType type) { return type == c10::kHalf || type == c10::kBFloat16; }

// A floating type as PyTorch spells its dtype: "float64", "float32", "bfloat16", "float16".
inline std::string float_type_name(c10::ScalarType type) {
  switch (type) {
    case c10::kDouble: return "float64";
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    default: return c10::toString(type);
  }
}

}  // namespace nanscope::probe
