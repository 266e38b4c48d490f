#pragma once
// The precision a step runs in: autocast off (fp32), or autocast to bf16 or
// fp16 (fp16 with the loss scaler). One type for the trainer, the probe's
// snapshots, replay and the step guard.
#include <optional>
#include <string>

namespace nanscope {

enum class Amp { off, bf16, fp16 };

// "off", "bf16", "fp16": the spelling of --amp and run.h5's config.
const char* amp_name(Amp amp);
// "fp32", "bf16", "fp16": the precision the step ran in (snapshots, reports).
const char* precision_name(Amp amp);
// Accepts both spellings ("off" and "fp32" are the same); nullopt otherwise.
std::optional<Amp> parse_amp(const std::string& text);

}  // namespace nanscope
