#pragma once
// Where a report finds what it reads: the run directory or run file it was
// given, the run files in it (one, or one per rank) and each rank's
// snapshots, by format/run_layout.hpp's names.
#include <string>
#include <vector>

#include "nanscope/format/run_layout.hpp"

namespace nanscope::report {

struct RunLocation {
  std::string run_dir;                  // holds the run files, and snapshots/ beside them
  std::vector<format::RankFile> files;  // run.h5 (rank -1), or each run-rank-R.h5 in rank order
  bool is_directory = false;            // given a directory: rank files may still appear in it
};

// A run directory (its run.h5 or run-rank-R.h5 files) or one run file.
// Throws format::FormatError naming the input when it does not exist, or is a
// directory with no run file (unless `may_be_empty`: a run about to start).
RunLocation locate_run(const std::string& input, bool may_be_empty);

// The snapshots rank `rank` (-1: a one-process run) wrote into `run_dir`,
// snapshots/step-NNNNNNN.h5 or snapshots/rank-R/..., in step order. A
// snapshot still being written (its .tmp) is not one yet.
std::vector<std::string> snapshot_files(const std::string& run_dir, int rank);

}  // namespace nanscope::report
