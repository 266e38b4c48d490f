#pragma once
// What the doom search (step_guard_doom.cpp) keeps between steps: the record
// of each step since the oldest saved state, to replay it, and its last
// finding, so that a later failure the same update still explains is not
// searched again. The rest of the guard only tells it when the run went back.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/step_history.hpp"

namespace nanscope {

class DoomMemory {
 public:
  explicit DoomMemory(size_t max_bytes) : history_(max_bytes) {}

  // A step as it ran; the records at or before `oldest_saved` (the oldest
  // saved state's step, -1 for none) can no longer be replayed and go.
  void record(StepRecord record, int64_t oldest_saved) {
    history_.add(std::move(record));
    history_.forget_through(oldest_saved);
  }
  // The records of the steps after the saved state of step `from` and before
  // `step`, oldest first (empty once the byte budget dropped one of them).
  std::vector<const StepRecord*> steps_between(int64_t from, int64_t step) const {
    return history_.between(from, step);
  }

  struct Finding {
    int64_t at_step = -1;  // the failing step whose search found it
    DoomFinding finding;
  };
  // The last finding while it still explains a replay from the state of step
  // `from`: the update it blamed came after that state.
  const Finding* still_explains(int64_t from) const {
    return found_ && found_->finding.step > from ? &*found_ : nullptr;
  }
  void found(int64_t at_step, DoomFinding finding) { found_ = Finding{at_step, std::move(finding)}; }

  // The run went back to before `step` (a rollback, a replay without the
  // dooming update): the records from it on are of steps that no longer
  // happened, and the last finding blamed an update that is gone.
  void forget_from(int64_t step) {
    history_.forget_from(step);
    found_.reset();
  }

 private:
  StepHistory history_;
  std::optional<Finding> found_;
};

}  // namespace nanscope
