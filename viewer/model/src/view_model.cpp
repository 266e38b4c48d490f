#include "nanscope/viewer/view_model.hpp"

#include <algorithm>
#include <filesystem>

#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::viewer {

namespace fs = std::filesystem;

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
      add_run(path, "");
    } else if (kind == format::kSnapshotFileKind) {
      add_snapshot(path, -1);
    } else {
      errors_.push_back("'" + path + "': is a '" + kind +
                        "' file; nanscope-view shows runs (run.h5) and snapshots");
    }
  }
  return errors_.size() == errors_before;
}

void ViewModel::open_run_dir(const std::string& dir) {
  const fs::path run_file = fs::path(dir) / "run.h5";
  std::error_code ec;
  if (!fs::exists(run_file, ec)) {
    errors_.push_back("'" + dir + "': no run.h5 in this directory (a --run-dir of nanscope-train?)");
    return;
  }
  if (add_run(run_file.string(), (fs::path(dir) / "snapshots").string()))
    scan_snapshot_dir(runs.size() - 1);
}

bool ViewModel::add_run(const std::string& path, const std::string& snapshot_dir) {
  RunSource run(path);
  if (!run.error().empty()) {
    errors_.push_back(run.error());
    return false;
  }
  runs.push_back(std::move(run));
  snapshot_dirs_.push_back(snapshot_dir);
  return true;
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
    const bool known = std::any_of(snapshots.begin(), snapshots.end(),
                                   [&](const SnapshotEntry& s) { return s.path == path; });
    if (known) continue;
    add_snapshot(path, int(run));
    added = true;
  }
  return added;
}

bool ViewModel::poll() {
  bool changed = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool was_following = runs[i].following();
    changed |= runs[i].poll() > 0;
    if (was_following && !runs[i].following()) {
      errors_.push_back(runs[i].error());
      changed = true;
    }
    // Snapshots are renamed into place whole, so a listed .h5 is complete.
    changed |= scan_snapshot_dir(i);
  }
  return changed;
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

}  // namespace nanscope::viewer
