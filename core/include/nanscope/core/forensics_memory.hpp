#pragma once
// What forensics (step_guard_forensics.cpp) keeps between steps: which
// births already have a snapshot and the snapshots written, the ranks of the
// run's first non-finite step, and --fallback auto's remedy for each first
// birth it diagnosed, so that the same birth later needs no new diagnosis.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/core/remedy.hpp"
#include "nanscope/core/snapshot_policy.hpp"

namespace nanscope {

class ForensicsMemory {
 public:
  explicit ForensicsMemory(int64_t max_snapshots) : snapshot_policy_(max_snapshots) {}

  // Whether the capture of `step` gets a snapshot (SnapshotPolicy, which remembers it).
  SnapshotPolicy::Decision snapshot_decision(int64_t step, const format::Capture& capture) {
    return snapshot_policy_.decide(step, capture);
  }
  void wrote_snapshot(std::string path) { snapshots_.push_back(std::move(path)); }
  const std::vector<std::string>& snapshots() const { return snapshots_; }

  // A step's non-finite ranks (several ranks); true when they are the run's first.
  bool nonfinite_ranks(const std::vector<int>& ranks) {
    if (!first_nonfinite_ranks_.empty() || ranks.empty()) return false;
    first_nonfinite_ranks_ = ranks;
    return true;
  }
  const std::vector<int>& first_nonfinite_ranks() const { return first_nonfinite_ranks_; }

  struct Diagnosed {
    int64_t step = -1;
    RemedyChoice remedy;
  };
  // The remedy diagnosed for first birth `birth` (birth_key) and at which step; nullptr if none.
  const Diagnosed* diagnosed(const std::string& birth) const {
    const auto it = remedy_of_birth_.find(birth);
    return birth.empty() || it == remedy_of_birth_.end() ? nullptr : &it->second;
  }
  void remember(const std::string& birth, int64_t step, const RemedyChoice& remedy) {
    if (!birth.empty()) remedy_of_birth_.emplace(birth, Diagnosed{step, remedy});
  }

 private:
  SnapshotPolicy snapshot_policy_;
  std::vector<std::string> snapshots_;
  std::vector<int> first_nonfinite_ranks_;
  std::map<std::string, Diagnosed> remedy_of_birth_;
};

}  // namespace nanscope
