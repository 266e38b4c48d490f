#pragma once
// A run's overview as a screen follows it (run_overview.hpp): opened from the
// file's stored blocks (or built from an older file's rows), then extended on
// refresh() by the rows the run has written since, folded in with the same
// builder the writer uses. The viewer's long-run path; read_run_overview is
// one open of it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "nanscope/format/run_overview.hpp"

namespace nanscope::format {

class OverviewFollower {
 public:
  // Reads the overview of every row committed so far; `progress(rows done,
  // rows)` is called while a file without one has its overview built.
  // Throws FormatError naming the file for a corrupt, truncated or
  // inconsistent one.
  explicit OverviewFollower(const std::string& path, const std::function<void(int64_t, int64_t)>& progress = nullptr);
  ~OverviewFollower();
  OverviewFollower(const OverviewFollower&) = delete;
  OverviewFollower& operator=(const OverviewFollower&) = delete;

  // Folds in the rows committed since the last call; returns how many.
  size_t refresh();
  // Each level's complete blocks, then its open (partial) block.
  const RunOverview& overview() const;
  RunOverview take() &&;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanscope::format
