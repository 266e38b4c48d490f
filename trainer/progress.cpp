#include "progress.hpp"

#include <cstdio>

namespace nanscope {

ProgressLine::ProgressLine(std::ostream& out, int64_t every_steps, bool quiet)
    : out_(out), every_steps_(every_steps), quiet_(quiet), last_time_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(const ProgressState& s) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - last_time_).count();
  const bool last = s.step + 1 == s.total_steps;
  const bool due = every_steps_ > 0 ? (s.step + 1) % every_steps_ == 0 : elapsed >= 1.0;
  if (!due && !last) return;
  const double steps_per_s = elapsed > 0 ? double(s.step - last_step_) / elapsed : 0.0;
  char line[256];
  std::snprintf(line, sizeof line,
                "step %lld/%lld  loss %.4f  scale %g  grad_norm %.3g  %s  skips %lld  %.1f steps/s",
                static_cast<long long>(s.step + 1), static_cast<long long>(s.total_steps), s.loss,
                s.loss_scale, s.grad_norm, s.precision, static_cast<long long>(s.skipped), steps_per_s);
  out_ << line << '\n' << std::flush;
  last_time_ = now;
  last_step_ = s.step;
}

}  // namespace nanscope
