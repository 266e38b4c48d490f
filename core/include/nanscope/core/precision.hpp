#pragma once
// The precision a step runs in: autocast off (fp32), or autocast to bf16 or
// fp16 (fp16 with the loss scaler). One type for the trainer, run.h5's
// /steps/amp, snapshots, replay and the step guard: format::Precision.

#include <string>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

using Amp = format::Precision;  // Amp::fp32 is autocast off

// "off", "bf16", "fp16": the spelling of --amp and run.h5's config.
const char* amp_name(Amp amp);
// "fp32", "bf16", "fp16": the precision the step ran in (snapshots, reports).
inline const char* precision_name(Amp amp) { return format::to_string(amp); }
// What a step at `amp` computes in, for the log (`own_16bit`:
// TrainableModel::own_16bit_type_name()).
using format::step_precision_name;

}  // namespace nanscope
