#include "nanscope/core/cause.hpp"

#include <algorithm>
#include <stdexcept>

#include "nanscope/probe/birth_category.hpp"

namespace nanscope {

int64_t donor_row(int64_t row, int64_t batch_size, const std::vector<int64_t>& suspects) {
  for (int64_t r = 0; r < batch_size; ++r)
    if (r != row && std::find(suspects.begin(), suspects.end(), r) == suspects.end()) return r;
  return row == 0 ? 1 : 0;
}

std::variant<Cause, EvidenceNeeded> classify_cause(const CauseEvidence& e) {
  Cause c;
  c.category = e.birth ? probe::category_of(*e.birth) : format::Category::other;
  auto decided = [&c](CauseRule rule, std::optional<format::Verdict> verdict) {
    c.rule = rule;
    c.verdict = verdict;
    return c;
  };
  if (!e.nonfinite_weights.empty()) {
    // Read from the weights, not re-run: no op of this step made the value.
    c.category = format::Category::nonfinite_weights;
    return decided(CauseRule::nonfinite_weights, format::Verdict::model_or_data);
  }
  if (e.eager_finite.value_or(false) && e.reproduced > 0) {
    // The same step, weights, batch, RNG state and precision: only the program differs.
    c.category = format::Category::compiled_program;
    return decided(CauseRule::compiled_program, format::Verdict::compiler);
  }
  // Re-runs that did not fail again say nothing of the batch or the model,
  // whatever the failed step's own capture named.
  if (e.repeats > 0 && e.reproduced == 0) return decided(CauseRule::not_reproduced, format::Verdict::transient);
  if (e.batch_nonfinite || (e.birth && e.birth->op.phase == format::Phase::input)) {
    c.category = format::Category::nonfinite_input;
    return decided(CauseRule::nonfinite_batch, format::Verdict::data);
  }
  // Finite inputs with nothing to average: no precision helps.
  if (c.category == format::Category::all_targets_ignored)
    return decided(CauseRule::no_counted_target, format::Verdict::data);
  // Another kernel of the born op makes the step finite: the kernel's fault,
  // whatever precision would do (the same precision, weights and batch).
  if (e.kernel_choice && !e.kernels) return EvidenceNeeded::kernel_reruns;
  if (e.kernels && !format::finite_kernels(*e.kernels).empty())
    return decided(CauseRule::kernel_differs, format::Verdict::kernel);

  switch (e.fp32) {
    case Fp32Rerun::not_run: return EvidenceNeeded::fp32_rerun;
    case Fp32Rerun::raised: return decided(CauseRule::fp32_rerun_raised, std::nullopt);
    case Fp32Rerun::finite: return decided(CauseRule::finite_in_fp32, format::Verdict::precision);
    case Fp32Rerun::unknown: c.fp32_unknown = true; break;
    case Fp32Rerun::nonfinite: break;
  }
  // Non-finite in fp32 too: precision is not the cause. An overflow (or a
  // birth of no named category) after the grad norm rose for steps is the
  // LR's doing.
  if (e.grad_norm_rose && (c.category == format::Category::overflow || c.category == format::Category::other))
    c.category = format::Category::grad_explosion;
  switch (e.rows.state) {
    case RowSearch::State::not_run: return EvidenceNeeded::row_search;
    case RowSearch::State::cannot_run: return decided(CauseRule::rows_not_searched, format::Verdict::model_or_data);
    case RowSearch::State::ran: break;
  }
  if (!e.rows.out_of_range.empty()) {
    c.rows = e.rows.out_of_range;
    return decided(CauseRule::rows_out_of_range, format::Verdict::data);
  }
  if (!e.rows.breaking.empty()) {
    // An ordinary sample that drives an unsafe op (log of a saturated
    // sigmoid, 0 / 0 on a blank row) is the op's trigger, not its cause.
    c.rows = e.rows.breaking;
    return decided(CauseRule::trigger_rows, format::Verdict::model_or_data);
  }
  return decided(CauseRule::every_row, format::Verdict::model_or_data);
}

Cause cause_of(const CauseEvidence& evidence) {
  const std::variant<Cause, EvidenceNeeded> c = classify_cause(evidence);
  if (const Cause* cause = std::get_if<Cause>(&c)) return *cause;
  switch (std::get<EvidenceNeeded>(c)) {
    case EvidenceNeeded::kernel_reruns: throw std::logic_error("cause_of: the evidence lacks the kernels' re-runs");
    case EvidenceNeeded::fp32_rerun: throw std::logic_error("cause_of: the evidence lacks the fp32 re-run");
    case EvidenceNeeded::row_search: break;
  }
  throw std::logic_error("cause_of: the evidence lacks the row search");
}

}  // namespace nanscope
