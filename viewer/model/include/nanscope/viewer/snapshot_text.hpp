#pragma once
// What the snapshot panel says about the sample a fault came from, built
// here without ImGui so the tests read the same words the window shows.
#include <string>
#include <vector>

#include "nanscope/format/snapshot_summary.hpp"

namespace nanscope::viewer {

// One line per piece of evidence, strongest first: the row an input birth
// arrived in; the batch rows the birth op made non-finite (Birth::rows, which
// names the sample even where replay could not bisect the batch: a model that
// draws random numbers); replay's batch bisection. Each batch row with its
// data set row, or "data set row unknown" (format/row_text.hpp). Empty: the
// snapshot traces the fault to no sample.
std::vector<std::string> offending_sample_lines(const format::SnapshotSummary& snapshot);

// Replay's re-runs in one line, named by what they computed in: "re-run at
// bf16: non-finite in 3 of 3; fp32: finite". A model of its own 16-bit weights
// ran at its own type, and its fp32 re-run widened them. Empty when the
// snapshot was never replayed.
std::string replay_reruns_line(const format::SnapshotSummary& snapshot);

}  // namespace nanscope::viewer
