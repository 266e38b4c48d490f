#pragma once
// Everything the viewer has open: runs (followed live), snapshots, and the
// inputs that could not be opened. No GL and no ImGui: the panels draw from
// this, and the tests drive it without a window.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/viewer/rank_group.hpp"
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
  // Opens each argument: a run directory (its run.h5 and snapshots/*.h5, or
  // every run-rank-R.h5 and snapshots/rank-R/*.h5 as one RankGroup), a run
  // file, or a snapshot. One that cannot be opened becomes an entry in
  // errors() and the others still open; returns false if any failed.
  bool open(const std::vector<std::string>& paths);

  // Live follow: new rows of every run still being followed, new snapshot
  // files in the run directories, rank files that appeared since (a rank that
  // started late), and each group's first non-finite ranks. Returns true when
  // anything changed.
  bool poll();
  // The steps on screen, `columns` pixels wide: long runs start fetching the
  // rows of a view narrow enough to show them (poll() takes them in).
  void focus(AxisRange steps, size_t columns);

  // Told of a long run whose overview is built from its rows as it opens
  // (written before format 1.12): the file, rows done, rows.
  std::function<void(const std::string&, int64_t, int64_t)> on_overview_build;

  std::vector<RunSource> runs;
  std::vector<SnapshotEntry> snapshots;
  std::vector<RankGroup> groups;  // one per multi-process run directory
  // The group run `run` is a rank of; null for a one-process run.
  const RankGroup* group_of(size_t run) const;
  // One line per input that could not be opened and per run that failed later.
  const std::vector<std::string>& errors() const { return errors_; }

  // The run to show first: in the first rank group that knows one, the first
  // rank to go non-finite (where the NaN was born is what a person opens a
  // multi-process run for); else run 0.
  size_t first_run_to_show() const;

  // The union of every run's steps; {0, 1} with no rows anywhere.
  AxisRange step_extent() const;

 private:
  void open_run_dir(const std::string& dir);
  // Adds a run that opened; a failed one becomes an error unless `quiet`.
  // `snapshot_dir` is watched for its snapshots ("" for none).
  bool add_run(const std::string& path, int rank, const std::string& snapshot_dir, bool quiet = false);
  void add_snapshot(const std::string& path, int run);
  bool scan_snapshot_dir(size_t run);
  // Opens the group's rank files not open yet; true if any opened.
  bool open_new_ranks(size_t group, bool quiet);
  // Re-derives world_size and first_nonfinite from the ranks' files; true if
  // either changed.
  bool refresh_group(RankGroup& group);

  std::vector<std::string> errors_;
  std::vector<std::string> snapshot_dirs_;  // per run: the directory watched for snapshots ("" none)
  std::vector<int> group_of_;               // per run: index into groups, -1 none
};

}  // namespace nanscope::viewer
