#pragma once
// What forensics (core/src/failed/forensics.hpp) keeps between steps: which
// births already have a snapshot and the snapshots written, the ranks of the
// run's first non-finite step, and --fallback auto's remedy for each first
// birth it diagnosed (with the samples that triggered it), so that the same
// fault met again needs no new diagnosis and escalates nothing.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
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
    RemedyChoice remedy;  // its trigger_samples: the samples that triggered it
  };
  // The remedy diagnosed for first birth `birth` (birth_key) and at which
  // step; nullptr if none. A diagnosis that named trigger samples is this
  // step's only where `samples` (the fingerprints of the rows this step's
  // birth names) holds one of them: the same op failing on another sample is
  // a new fault.
  // `samples` is asked for only where a diagnosis of the same birth named some.
  const Diagnosed* diagnosed(const std::string& birth, const std::function<std::vector<uint64_t>()>& samples) const {
    if (birth.empty()) return nullptr;
    const auto range = remedy_of_birth_.equal_range(birth);
    std::optional<std::vector<uint64_t>> seen;
    for (auto it = range.first; it != range.second; ++it) {
      const std::vector<uint64_t>& triggers = it->second.remedy.trigger_samples;
      if (triggers.empty()) return &it->second;
      if (!seen) seen = samples();
      for (uint64_t t : triggers)
        if (std::find(seen->begin(), seen->end(), t) != seen->end()) return &it->second;
    }
    return nullptr;
  }
  void remember(const std::string& birth, int64_t step, const RemedyChoice& remedy) {
    if (!birth.empty() && !diagnosed(birth, [&] { return remedy.trigger_samples; }))
      remedy_of_birth_.emplace(birth, Diagnosed{step, remedy});
  }

 private:
  SnapshotPolicy snapshot_policy_;
  std::vector<std::string> snapshots_;
  std::vector<int> first_nonfinite_ranks_;
  std::multimap<std::string, Diagnosed> remedy_of_birth_;
};

}  // namespace nanscope
