#pragma once
// Everything the viewer has open: runs (followed live), snapshots, and the
// inputs that could not be opened. No GL and no ImGui: the panels draw from
// this, and the tests drive it without a window.
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/viewer/run_source.hpp"

namespace nanscope::viewer {

struct SnapshotEntry {
  std::string path;
  std::optional<format::SnapshotSummary> summary;  // empty when it could not be read
  std::string error;
  int run = -1;  // index into ViewModel::runs of the run directory it came from
};

class ViewModel {
 public:
  // Opens each argument: a run directory (its run.h5 and snapshots/*.h5), a
  // run.h5, or a snapshot. One that cannot be opened becomes an entry in
  // errors() and the others still open; returns false if any failed.
  bool open(const std::vector<std::string>& paths);

  // Live follow: new rows of every run still being followed and new snapshot
  // files in the run directories. Returns true when anything changed.
  bool poll();

  std::vector<RunSource> runs;
  std::vector<SnapshotEntry> snapshots;
  // One line per input that could not be opened and per run that failed later.
  const std::vector<std::string>& errors() const { return errors_; }

  // The union of every run's steps; {0, 1} with no rows anywhere.
  AxisRange step_extent() const;

 private:
  void open_run_dir(const std::string& dir);
  // Adds a run that opened; a failed one becomes an error. `snapshot_dir` is
  // watched for its snapshots ("" for none).
  bool add_run(const std::string& path, const std::string& snapshot_dir);
  void add_snapshot(const std::string& path, int run);
  bool scan_snapshot_dir(size_t run);

  std::vector<std::string> errors_;
  std::vector<std::string> snapshot_dirs_;  // per run: the directory watched for snapshots ("" none)
};

}  // namespace nanscope::viewer
