#pragma once
// Replay's precision trail: where, op by op, the step at its own precision
// left the same step in fp32 (format/precision_trail.hpp).
#include "nanscope/format/precision_trail.hpp"
#include "rebuild.hpp"

namespace nanscope::replay {

// Runs the snapshot's step at its precision and in fp32, each under op-level
// capture, and compares them up to the low-precision run's first birth.
// Leaves setup's re-run error as it found it. For a step below fp32 (autocast,
// or a model of its own 16-bit weights).
format::PrecisionTrail trace_precision(ReplaySetup& setup);

}  // namespace nanscope::replay
