#pragma once
// Where a run's files live in its --run-dir. The one place that knows the
// layout: the trainer writes by it, replay and the viewer find files by it.
//
//   one process:        RUN_DIR/run.h5         RUN_DIR/snapshots/step-NNNNNNN.h5
//   N processes (c10d): RUN_DIR/run-rank-R.h5  RUN_DIR/snapshots/rank-R/step-NNNNNNN.h5
#include <cstdint>
#include <string>
#include <vector>

namespace nanscope::format {

struct RankFile {
  int rank = -1;  // -1: a one-process run (run.h5)
  std::string path;
};

// "run.h5" for a one-process run, "run-rank-R.h5" for rank R of a larger one.
std::string run_file_name(int rank, int world_size);
// The folder rank R's snapshots go to.
std::string snapshot_dir(const std::string& run_dir, int rank, int world_size);
// A run directory's run files: run.h5 (rank -1) and/or every run-rank-R.h5,
// in rank order. Empty when there are none.
std::vector<RankFile> run_files_in(const std::string& run_dir);
// The run file that wrote a snapshot, found from the snapshot's own path
// (snapshots/step-N.h5 -> ../run.h5, snapshots/rank-R/step-N.h5 ->
// ../../run-rank-R.h5); "" when the snapshot is not inside a run directory.
std::string run_file_beside_snapshot(const std::string& snapshot_path);

}  // namespace nanscope::format
