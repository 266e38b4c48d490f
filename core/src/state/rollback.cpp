#include "nanscope/core/rollback.hpp"

#include <algorithm>
#include <cmath>

namespace nanscope {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// A warning this close before the trouble counts as its start: the state to
// go back to is one from before it.
constexpr int64_t kWarningReach = 50;
// Healthy steps before a loss can be a spike: the largest loss of the first
// few is no baseline (a saturated BCE goes from 0.8 to 50 at step 1 of a run
// that then trains well), and no state is saved to go back to before then.
constexpr int64_t kSpikeBaseline = 10;
}  // namespace

RollbackPolicy::RollbackPolicy(RollbackOptions options) : options_(options) {}

double RollbackPolicy::spike_threshold() const {
  return healthy_steps_ >= kSpikeBaseline ? options_.spike_ratio * max_healthy_loss_ : kInf;
}

double RollbackPolicy::skip_loss_above(int64_t step) const {
  return step <= probation_until_ ? spike_threshold() : kInf;
}

bool RollbackPolicy::observe(int64_t step, double loss, bool nonfinite, bool skipped_as_spike) {
  if (skipped_as_spike) {
    ++probation_skips_;
    return true;
  }
  // A negative loss (a log-likelihood) has no meaningful ratio: only non-finite counts then.
  const bool spike = !nonfinite && max_healthy_loss_ > 0 && loss >= spike_threshold();
  if (nonfinite || spike) {
    if (streak_++ == 0) streak_start_ = step;
    return true;
  }
  streak_ = 0;
  probation_skips_ = 0;
  ++healthy_steps_;
  max_healthy_loss_ = std::max(max_healthy_loss_, loss);
  return false;
}

bool RollbackPolicy::trouble_persists() const {
  return streak_ >= options_.patience || probation_skips_ >= options_.max_probation_skips;
}

int64_t RollbackPolicy::trouble_began() const {
  const int64_t start = streak_ > 0 ? streak_start_ : probation_until_ - options_.probation_steps;
  return start - last_warning_ <= kWarningReach ? std::min(start, last_warning_) : start;
}

void RollbackPolicy::warned(int64_t step) {
  // The first warning of a run of them marks where the trouble began.
  if (step - last_warning_ > kWarningReach) last_warning_ = step;
}

bool RollbackPolicy::wants_state(int64_t step) const {
  return (options_.enabled || keep_states_) && options_.every > 0 && (step + 1) % options_.every == 0 && streak_ == 0 &&
         step > probation_until_ && step - last_warning_ > kWarningReach;
}

void RollbackPolicy::rolled_back(int64_t step) {
  ++rollbacks_;
  streak_ = 0;
  probation_skips_ = 0;
  probation_until_ = step + options_.probation_steps;
}

}  // namespace nanscope
