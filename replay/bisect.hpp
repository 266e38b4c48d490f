#pragma once
// Replay's bisections: which modules must run in fp32, and which samples the
// step cannot survive.
#include <string>
#include <vector>

#include "nanscope/replay/verdict.hpp"
#include "rebuild.hpp"

namespace nanscope::replay {

struct Fp32RegionSearch {
  Fp32Search outcome = Fp32Search::not_run;
  std::vector<std::string> modules;  // when found
};

// The smallest set (1-minimal: no member can be dropped) of module paths that,
// run in fp32, make the step finite at its original precision. Native models
// switch autocast off in their module scopes, TorchScript models in their
// modules' interpreter frames (probe/scripted_fp32_regions.hpp); `unsupported`
// when a TorchScript re-run entered no chosen module's frame.
Fp32RegionSearch smallest_fp32_region(ReplaySetup& setup);

// Batch rows whose removal alone makes the step finite; with `replace`, each
// row replaced by a copy of another (donor_row) instead of removed, for a
// step that draws random numbers (a removed row would shift every later draw).
std::vector<int64_t> samples_without_which_finite(ReplaySetup& setup, bool replace = false);

}  // namespace nanscope::replay
