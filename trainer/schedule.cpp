#include "nanscope/trainer/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace nanscope::trainer {

double scheduled_lr(Schedule schedule, double peak, int64_t warmup, int64_t total_steps, int64_t step) {
  if (step < warmup) return peak * double(step + 1) / double(warmup);
  if (schedule != Schedule::cosine) return peak;
  const double span = double(std::max<int64_t>(1, total_steps - warmup));
  const double progress = std::clamp(double(step - warmup) / span, 0.0, 1.0);
  return peak * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace nanscope::trainer
