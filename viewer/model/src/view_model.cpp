#include "nanscope/viewer/view_model.hpp"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>

#include "nanscope/format/error.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::viewer {

namespace fs = std::filesystem;

namespace {

// A config attribute as a positive int; 0 when absent or not a number.
int positive_int(const std::map<std::string, std::string>& config, const std::string& key) {
  const auto it = config.find(key);
  if (it == config.end()) return 0;
  int value = 0;
  const char* end = it->second.data() + it->second.size();
  const auto [next, ec] = std::from_chars(it->second.data(), end, value);
  return ec == std::errc() && next == end && value > 0 ? value : 0;
}

std::string dir_name(const std::string& dir) {
  fs::path p(dir);
  if (p.filename().empty()) p = p.parent_path();  // "run/"
  return p.filename().string();
}

}  // namespace

bool ViewModel::open(const std::vector<std::string>& paths) {
  const size_t errors_before = errors_.size();
  for (const std::string& path : paths) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      open_run_dir(path);
      continue;
    }
    std::string kind;
    try {
      kind = format::file_kind(path);
    } catch (const format::FormatError& e) {
      errors_.push_back(e.what());
      continue;
    }
    if (kind == format::kRunFileKind) {
      add_run(path, -1, "");
    } else if (kind == format::kSnapshotFileKind) {
      add_snapshot(path, -1);
    } else {
      errors_.push_back("'" + path + "': is a '" + kind + "' file; nanscope-view shows runs (run.h5) and snapshots");
    }
  }
  return errors_.size() == errors_before;
}

void ViewModel::open_run_dir(const std::string& dir) {
  const std::vector<format::RankFile> files = format::run_files_in(dir);
  if (files.empty()) {
    errors_.push_back("'" + dir + "': no run.h5 (or run-rank-R.h5) in this directory (a --run-dir of nanscope-train?)");
    return;
  }
  if (files.front().rank < 0 && add_run(files.front().path, -1, format::snapshot_dir(dir, -1, 1)))
    scan_snapshot_dir(runs.size() - 1);
  if (files.back().rank < 0) return;  // no rank files
  RankGroup group;
  group.dir = dir;
  group.label = dir_name(dir);
  groups.push_back(std::move(group));
  // Kept even when no rank opened: a rank file still being created opens on a later poll.
  open_new_ranks(groups.size() - 1, /*quiet=*/false);
  refresh_group(groups.back());
}

bool ViewModel::open_new_ranks(size_t group_index, bool quiet) {
  RankGroup& group = groups[group_index];
  bool added = false;
  for (const format::RankFile& file : format::run_files_in(group.dir)) {
    if (file.rank < 0) continue;
    const bool is_open =
        std::any_of(group.runs.begin(), group.runs.end(), [&](size_t run) { return runs[run].rank() == file.rank; });
    if (is_open) continue;
    // Only a run of more than one process writes rank files, whatever its
    // config says (snapshot_dir takes the world size for that alone).
    const std::string snapshots = format::snapshot_dir(group.dir, file.rank, std::max(2, group.world_size));
    if (!add_run(file.path, file.rank, snapshots, quiet)) continue;
    group.runs.push_back(runs.size() - 1);
    group_of_.back() = int(group_index);
    scan_snapshot_dir(runs.size() - 1);
    added = true;
  }
  std::sort(group.runs.begin(), group.runs.end(), [&](size_t a, size_t b) { return runs[a].rank() < runs[b].rank(); });
  return added;
}

bool ViewModel::refresh_group(RankGroup& group) {
  int world_size = 0;
  for (size_t run : group.runs)
    world_size = std::max({world_size, runs[run].rank() + 1, positive_int(runs[run].data().config, "world_size")});
  // Every rank records the same list; the earliest that parses wins, so one
  // rank's garbled or missing event does not hide the others'.
  FirstNonfiniteRanks first;
  for (size_t run : group.runs) {
    FirstNonfiniteRanks candidate = first_nonfinite_ranks(runs[run].data().events, world_size);
    if (candidate.known() && (!first.known() || candidate.step < first.step)) first = std::move(candidate);
  }
  const bool changed = world_size != group.world_size || first.step != group.first_nonfinite.step ||
                       first.ranks != group.first_nonfinite.ranks;
  group.world_size = world_size;
  group.first_nonfinite = std::move(first);
  return changed;
}

bool ViewModel::add_run(const std::string& path, int rank, const std::string& snapshot_dir, bool quiet) {
  try {
    format::clear_mark_if_writer_gone(path);  // a killed writer's file opens in plain h5py then
  } catch (const format::FormatError&) {
    // RunSource says what is wrong with the file
  }
  RunSource::OverviewProgress progress;
  if (on_overview_build) progress = [&](int64_t done, int64_t rows) { on_overview_build(path, done, rows); };
  RunSource run(path, rank, progress);
  if (!run.error().empty()) {
    if (!quiet) errors_.push_back(run.error());
    return false;
  }
  runs.push_back(std::move(run));
  snapshot_dirs_.push_back(snapshot_dir);
  group_of_.push_back(-1);
  return true;
}

const RankGroup* ViewModel::group_of(size_t run) const {
  return run < group_of_.size() && group_of_[run] >= 0 ? &groups[size_t(group_of_[run])] : nullptr;
}

void ViewModel::add_snapshot(const std::string& path, int run) {
  SnapshotEntry entry;
  entry.path = path;
  entry.run = run;
  try {
    entry.summary = format::read_snapshot_summary(path);
  } catch (const format::FormatError& e) {
    entry.error = e.what();
    errors_.push_back(entry.error);
  }
  snapshots.push_back(std::move(entry));
}

bool ViewModel::scan_snapshot_dir(size_t run) {
  const std::string& dir = snapshot_dirs_[run];
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return false;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".h5") found.push_back(entry.path().string());  // not *.h5.tmp
  std::sort(found.begin(), found.end());
  bool added = false;
  for (const std::string& path : found) {
    const bool known =
        std::any_of(snapshots.begin(), snapshots.end(), [&](const SnapshotEntry& s) { return s.path == path; });
    if (known) continue;
    add_snapshot(path, int(run));
    added = true;
  }
  return added;
}

bool ViewModel::poll() {
  bool changed = false;
  // A rank that starts late: its file fails to open while being created, so
  // a failure here is retried on the next poll rather than reported.
  for (size_t g = 0; g < groups.size(); ++g) changed |= open_new_ranks(g, /*quiet=*/true);
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool was_following = runs[i].following();
    changed |= runs[i].poll() > 0;
    if (was_following && !runs[i].following()) {
      errors_.push_back(runs[i].error());
      changed = true;
    }
    if (std::string error = runs[i].take_window_error(); !error.empty()) {
      errors_.push_back(std::move(error));
      changed = true;
    }
    // Snapshots are renamed into place whole, so a listed .h5 is complete.
    changed |= scan_snapshot_dir(i);
  }
  for (RankGroup& group : groups) changed |= refresh_group(group);
  return changed;
}

void ViewModel::focus(AxisRange steps, size_t columns) {
  for (RunSource& run : runs) run.focus(steps, columns);
}

AxisRange ViewModel::step_extent() const {
  bool any = false;
  AxisRange extent{0, 1};
  for (const RunSource& run : runs) {
    if (run.data().rows() == 0) continue;
    const AxisRange r = run.step_extent();
    extent = any ? AxisRange{std::min(extent.lo, r.lo), std::max(extent.hi, r.hi)} : r;
    any = true;
  }
  return extent;
}

size_t ViewModel::first_run_to_show() const {
  for (const RankGroup& group : groups) {
    if (!group.first_nonfinite.known()) continue;
    for (size_t run : group.runs)
      if (group.first_nonfinite.has(runs[run].rank())) return run;
  }
  return 0;
}

}  // namespace nanscope::viewer
