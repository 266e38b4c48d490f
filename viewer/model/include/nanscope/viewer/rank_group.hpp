#pragma once
// The ranks of one multi-process (c10d) run directory, shown side by side, and
// which rank's local gradients went non-finite first. Each rank writes its own
// run-rank-R.h5 (format/run_layout.hpp); at the first skipped step every rank
// also records the ranks whose local check failed, as the event
// format::to_string(format::EventKind::first_nonfinite) with text "1" or "0,2".
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"

namespace nanscope::viewer {

struct FirstNonfiniteRanks {
  int64_t step = -1;       // -1: unknown (no such event yet, or none that parses)
  std::vector<int> ranks;  // ascending, no repeats; empty when unknown
  bool known() const { return step >= 0; }
  bool has(int rank) const;
};

// The earliest format::to_string(format::EventKind::first_nonfinite) event in `events` whose list parses.
FirstNonfiniteRanks first_nonfinite_ranks(const std::vector<format::RunEvent>& events, int world_size);

// One run directory's rank files, opened as runs of a ViewModel.
struct RankGroup {
  std::string dir;
  std::string label;                    // the directory's name, as its runs' labels start
  int world_size = 0;                   // from the ranks' `world_size` config; else highest rank + 1
  std::vector<size_t> runs;             // indices into ViewModel::runs, in rank order
  FirstNonfiniteRanks first_nonfinite;  // every rank records it; the earliest that parses
};

}  // namespace nanscope::viewer
