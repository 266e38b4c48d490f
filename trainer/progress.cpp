#include "nanscope/trainer/progress.hpp"

#include <cmath>
#include <cstdio>
#include <string>

namespace nanscope::trainer {

namespace {

// A loss for the progress line; printf's "-nan" depends on a sign bit nobody asked about.
std::string loss_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", v);
  return text;
}

}  // namespace

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
  // A skipped step says what was not finite. A NaN loss also names the last
  // good one (the figure the summary prints); a finite loss beside non-finite
  // gradients is its own figure and needs no other.
  std::string loss = "loss " + loss_text(s.loss);
  if (s.step_skipped && std::isfinite(s.loss))
    loss += " (skipped: gradients non-finite)";
  else if (s.step_skipped)
    loss += s.last_finite_step < 0 ? " (skipped; no finite loss yet)"
                                   : " (skipped; last finite " + loss_text(s.last_finite_loss) + " at step " +
                                         std::to_string(s.last_finite_step) + ")";
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  %s  scale %g  grad_norm %.3g  %s  skips %lld  %.1f steps/s",
                static_cast<long long>(s.step + 1), static_cast<long long>(s.total_steps), loss.c_str(), s.loss_scale,
                s.grad_norm, s.precision, static_cast<long long>(s.skipped), steps_per_s);
  out_ << line << '\n' << std::flush;
  last_time_ = now;
  last_step_ = s.step;
}

}  // namespace nanscope::trainer
