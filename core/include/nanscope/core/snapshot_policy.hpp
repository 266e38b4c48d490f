#pragma once
// Which non-finite steps get a snapshot. A run that stays non-finite would
// otherwise write one every step (a real model's weights and optimizer state
// each time, until the disk is full), though every later step only repeats the
// first one's story. A snapshot is written for a first birth not seen before
// (its kind, op and module), at most `max_snapshots` in a run.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "nanscope/format/capture.hpp"

namespace nanscope {

// What makes two first births the same story: kind, op and module
// ("not-reproduced" / "rerun-failed" when the re-run found none).
std::string birth_key(const format::Capture& capture);

class SnapshotPolicy {
 public:
  explicit SnapshotPolicy(int64_t max_snapshots) : max_snapshots_(max_snapshots) {}

  struct Decision {
    bool write = false;
    std::string why_not;  // for the snapshot_skipped event: which earlier step, or the cap
  };
  // Decides for the capture of `step`, and remembers a birth it lets through.
  Decision decide(int64_t step, const format::Capture& capture);

 private:
  int64_t max_snapshots_;
  int64_t skipped_ = 0;
  std::map<std::string, int64_t> step_of_birth_;  // birth key -> the step whose snapshot has it
};

}  // namespace nanscope
