#pragma once
// The progress line: one line per interval (about a second, or every N steps).
#include <chrono>
#include <cstdint>
#include <ostream>

namespace nanscope::trainer {

struct ProgressState {
  int64_t step = 0, total_steps = 0, skipped = 0;
  double loss = 0;  // this step's
  bool step_skipped = false;
  double last_finite_loss = 0;  // what the summary reports, named as such when this step was skipped
  int64_t last_finite_step = -1;
  double loss_scale = 1, grad_norm = 0;
  const char* precision = "fp32";
};

class ProgressLine {
 public:
  ProgressLine(std::ostream& out, int64_t every_steps, bool quiet);
  // Prints when the interval has passed (always for the last step).
  void update(const ProgressState& state);

 private:
  std::ostream& out_;
  int64_t every_steps_;
  bool quiet_;
  std::chrono::steady_clock::time_point last_time_;
  int64_t last_step_ = -1;
};

}  // namespace nanscope::trainer
