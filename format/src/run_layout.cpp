#include "nanscope/format/run_layout.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace nanscope::format {

namespace fs = std::filesystem;

namespace {

constexpr const char* kRankRunPrefix = "run-rank-";
constexpr const char* kRankDirPrefix = "rank-";

// The R of PREFIX + R + SUFFIX, or -1.
int rank_in(const std::string& name, const std::string& prefix, const std::string& suffix) {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::atoi(digits.c_str());
}

}  // namespace

std::string run_file_name(int rank, int world_size) {
  return world_size > 1 ? kRankRunPrefix + std::to_string(rank) + ".h5" : "run.h5";
}

std::string snapshot_dir(const std::string& run_dir, int rank, int world_size) {
  fs::path dir = fs::path(run_dir) / "snapshots";
  if (world_size > 1) dir /= kRankDirPrefix + std::to_string(rank);
  return dir.string();
}

std::vector<RankFile> run_files_in(const std::string& run_dir) {
  std::vector<RankFile> files;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(run_dir) / "run.h5", ec))
    files.push_back({-1, (fs::path(run_dir) / "run.h5").string()});
  std::vector<RankFile> ranks;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int rank = rank_in(it->path().filename().string(), kRankRunPrefix, ".h5");
    if (rank >= 0 && it->is_regular_file(ec)) ranks.push_back({rank, it->path().string()});
  }
  std::sort(ranks.begin(), ranks.end(), [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
  files.insert(files.end(), ranks.begin(), ranks.end());
  return files;
}

std::string run_file_beside_snapshot(const std::string& snapshot_path) {
  const fs::path folder = fs::path(snapshot_path).parent_path();
  const int rank = rank_in(folder.filename().string(), kRankDirPrefix, "");
  const fs::path snapshots = rank >= 0 ? folder.parent_path() : folder;
  if (snapshots.filename() != "snapshots") return "";
  return (snapshots.parent_path() / (rank >= 0 ? kRankRunPrefix + std::to_string(rank) + ".h5" : "run.h5")).string();
}

}  // namespace nanscope::format
