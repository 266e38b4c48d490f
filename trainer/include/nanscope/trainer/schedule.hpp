#pragma once
#include <cstdint>
#include <string>

#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

// Learning rate at `step` (0-based): linear warmup to `peak` over `warmup`
// steps (P12), then constant, or cosine decay to 0 at `total_steps`.
double scheduled_lr(Schedule schedule, double peak, int64_t warmup, int64_t total_steps, int64_t step);

}  // namespace nanscope::trainer
