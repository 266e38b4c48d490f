#include "run_location.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "nanscope/format/error.hpp"

namespace nanscope::report {

namespace fs = std::filesystem;

RunLocation locate_run(const std::string& input, bool may_be_empty) {
  std::error_code ec;
  const fs::file_status status = fs::status(input, ec);
  if (ec || !fs::exists(status)) throw format::FormatError(input, "no such file or directory");
  RunLocation location;
  if (fs::is_directory(status)) {
    location.run_dir = input;
    location.is_directory = true;
    location.files = format::run_files_in(input);
    if (location.files.empty() && !may_be_empty)
      throw format::FormatError(input, "no run.h5 or run-rank-R.h5 in this directory (not a run directory?)");
    return location;
  }
  // One file: its rank is the one its name gives in its folder (run-rank-R.h5);
  // any other name is a one-process run's file.
  const fs::path file(input);
  location.run_dir = file.has_parent_path() ? file.parent_path().string() : ".";
  format::RankFile rank_file{-1, input};
  for (const format::RankFile& beside : format::run_files_in(location.run_dir))
    if (fs::path(beside.path).filename() == file.filename()) rank_file.rank = beside.rank;
  location.files.push_back(rank_file);
  return location;
}

std::vector<std::string> snapshot_files(const std::string& run_dir, int rank) {
  // snapshot_dir asks only whether the run had more than one process.
  const std::string folder = rank < 0 ? format::snapshot_dir(run_dir, 0, 1)
                                      : format::snapshot_dir(run_dir, rank, std::numeric_limits<int>::max());
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool snapshot_name =
        name.size() > 8 && name.compare(0, 5, "step-") == 0 && name.compare(name.size() - 3, 3, ".h5") == 0;
    if (snapshot_name && it->is_regular_file(ec)) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());  // zero-padded step numbers: name order is step order
  return files;
}

}  // namespace nanscope::report
