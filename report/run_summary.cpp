#include "run_summary.hpp"

#include <algorithm>
#include <cmath>

#include "nanscope/format/event_text.hpp"

namespace nanscope::report {

format::Precision row_precision(uint8_t amp) {
  // /steps/amp holds the precisions in their enum order (0 fp32, 1 bf16, 2 fp16).
  return amp < format::Words<format::Precision>::count ? static_cast<format::Precision>(amp)
                                                       : format::Precision::unknown;
}

RunSummary summarize_run(const format::RunData& run) {
  RunSummary s;
  s.rows = run.rows();
  if (s.rows == 0) return s;
  s.first_step = run.step.front();
  s.last_step = run.step.back();
  s.final_loss = StepValue{run.step.back(), run.loss.back()};

  const std::vector<uint8_t> rolled_back = format::rolled_back_rows(run);
  for (size_t i = 0; i < s.rows; ++i) {
    if (run.skipped[i])
      ++s.skipped;
    else if (rolled_back[i])
      ++s.rolled_back;
    else
      ++s.counted;
    if (!run.skipped[i] && std::isfinite(run.loss[i])) s.last_finite_loss = StepValue{run.step[i], run.loss[i]};

    const format::Precision precision = row_precision(run.amp[i]);
    if (s.amp.empty() || s.amp.back().precision != precision) {
      if (precision == format::Precision::fp32 && !s.amp.empty() && !s.fp32_from_step) s.fp32_from_step = run.step[i];
      s.amp.push_back({precision, run.step[i], run.step[i]});
    }
    s.amp.back().last_step = run.step[i];
    if (precision == format::Precision::fp16) {
      s.loss_scale_min = std::min(s.loss_scale_min.value_or(run.loss_scale[i]), run.loss_scale[i]);
      s.loss_scale_max = std::max(s.loss_scale_max.value_or(run.loss_scale[i]), run.loss_scale[i]);
    }
  }
  return s;
}

std::optional<RollbackSpan> rollback_span(const format::RunData& run, const format::RunEvent& rollback) {
  const std::optional<int64_t> to = format::rollback_target(rollback.text);
  if (!to) return std::nullopt;
  RollbackSpan span{*to, rollback.step, 0};
  // The same rule as format::rolled_back_rows, for this one rollback.
  span.rows_taken_back = size_t(std::count_if(run.step.begin(), run.step.end(),
                                              [&](int64_t step) { return step > *to && step <= rollback.step; }));
  return span;
}

}  // namespace nanscope::report
