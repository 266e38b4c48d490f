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

}  // namespace nanscope::viewer
