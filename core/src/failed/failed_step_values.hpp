#pragma once
// The values a failed step's pipeline passes on, one stage to the next
// (step_guard_failed.cpp): what the forensics found, what the doom search
// found, what the recovery did, and all of it together for the step's end,
// where its GuardedStep is built once. Private to the guard's files.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/remedy.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/format/capture.hpp"

namespace nanscope {

// The forensic re-run's findings.
struct ForensicFindings {
  std::optional<format::Capture> capture;  // nullopt: not re-run (and no birth in the batch)
  std::string first_birth;                 // GuardedStep::first_birth
  std::string snapshot;                    // the snapshot written, or ""
  // The step's buffers were non-finite, its re-run from the buffers the skip
  // put back was finite, and calls outside its losses ran in it: they wrote them.
  bool buffers_written_outside = false;
};

// The doom search's finding. Its sentence is said once the recovery is
// decided (a replay that stands adds its clause).
struct DoomSearchResult {
  std::string doomed_by;  // GuardedStep::doomed_by ("": not run)
  int64_t doomed_by_step = -1;
  std::vector<int64_t> rows;
  std::optional<DoomFinding> finding;  // a new search's (nullopt: not searched, or found before)
  int64_t replayed_from = -1;          // the saved state the replays ran from
  std::string sentence;                // the doom event's text, from the new search
  // The run replayed without the dooming update survives (its state is the
  // model's now, and the live one is held: HeldLiveState).
  bool replay_survives = false;
};

// The live model state while the run replayed without the dooming update
// stands in for it. The failed-step path owns it from the doom search on;
// RecoveryActions::apply alone lets it go (the replay stands) or puts it back
// (the run goes on from the live step).
class HeldLiveState {
 public:
  void hold(StateRing live) { live_.emplace(std::move(live)); }
  bool held() const { return live_.has_value(); }
  const TrainingState& state() const { return *live_->oldest(); }
  void release() { live_.reset(); }

 private:
  std::optional<StateRing> live_;
};

// What carrying out the recovery did, for the GuardedStep.
struct RecoveryDone {
  Remedy remedy = Remedy::none;
  bool fell_back = false;
  int64_t rolled_back_to = -1;
};

// What a failed step's pipeline came to, stage by stage: the value the
// step's GuardedStep takes its birth, snapshot, doom and recovery fields
// from (all empty for the loss scaler's routine backoff).
struct FailedStepConclusion {
  ForensicFindings found;
  DoomSearchResult doom;
  RecoveryDone done;
  std::vector<int64_t> listed_samples;  // the data set rows a `data` verdict added to the poison list
};

}  // namespace nanscope
