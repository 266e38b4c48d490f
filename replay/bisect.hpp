#pragma once
// Replay's bisections: which modules must run in fp32, and which samples the
// step cannot survive.
#include <string>
#include <vector>

#include "rebuild.hpp"

namespace nanscope::replay {

// The smallest set (1-minimal: no member can be dropped) of module paths that,
// run with autocast off, make the step finite at its original precision.
// Empty when even every module in fp32 does not help, or the model opens no
// module scopes (TorchScript models: their modules cannot be switched).
std::vector<std::string> smallest_fp32_region(ReplaySetup& setup);

// Batch rows whose removal alone makes the step finite.
std::vector<int64_t> samples_without_which_finite(ReplaySetup& setup);

}  // namespace nanscope::replay
