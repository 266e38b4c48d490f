#include "verdict.hpp"

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/probe/birth_category.hpp"

#include <algorithm>
#include <limits>
#include <set>

namespace nanscope::replay {

namespace {

std::string module_text(const std::string& module) { return module.empty() ? "the root module" : module; }

std::string join_rows(const std::vector<int64_t>& rows) {
  std::string out;
  for (int64_t r : rows) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// The playbook's fix for each origin (docs/playbook.md P8, P10-P18), naming the module.
std::string fix_for(format::Category category, const format::Birth& b, format::Precision precision) {
  const std::string where = module_text(b.op.module);
  if (category == format::Category::log_nonpositive)
    return "clamp the input of " + b.op.op + " in " + where +
           (probe::bare_op_name(b.op.op) == "log1p" ? " above -1 (x.clamp(min=-1 + 1e-7))" : " (x.clamp(min=1e-7))") +
           " or add eps inside it; never hand-roll log(softmax(x)): use log_softmax / cross_entropy (P8)";
  if (category == format::Category::sqrt_grad_zero)
    return "the gradient of sqrt at 0 is infinite: add eps inside the sqrt in " + where + " (sqrt(x + 1e-12)) (P8)";
  if (category == format::Category::div_by_zero)
    return "add eps to the divisor of " + b.op.op + " in " + where + " (a / (b + 1e-8); variance + eps in a norm) (P8)";
  if (category == format::Category::exp_overflow)
    return "exp overflows in " + where +
           ": subtract the max before exp (use softmax / log_softmax / logsumexp), clamp the exponent (P8)";
  if (category == format::Category::fully_masked_softmax)
    return "a softmax in " + where +
           " ran over a row with every position masked: guard fully masked rows (mask the output, or "
           "use a large negative instead of -inf) (P8)";
  if (category == format::Category::overflow)
    // No wider type here: whether fp32 helps is the verdict's to say, from the fp32 re-run.
    return "values in " + where + " exceed the range of " +
           (precision == format::Precision::unknown ? std::string("the precision") : format::to_string(precision)) +
           ": find what grows before it (logits, activations, grad norms); z-loss (P15) and QK-LayerNorm (P16) "
           "stop logits growing (P10)";
  if (category == format::Category::grad_explosion)
    return "the gradients explode: lengthen warmup or lower the LR (P12), clip the global norm (P13), "
           "check the init (P17)";
  if (category == format::Category::all_targets_ignored)
    return "every target of the batch is " + b.op.op +
           "'s ignore_index, so its mean is over zero targets: 0 / 0 (every gradient is exactly 0). Skip "
           "batches with no counted target (padding-only chunks), or take the loss with reduction sum and "
           "divide by the number of counted targets clamped to at least 1";
  if (category == format::Category::nonfinite_input)
    return "the batch itself holds a non-finite value: guard the data boundary with "
           "assert isfinite(x).all() naming the index (P11)";
  return "inspect " + b.op.op + " in " + where + " with the snapshot's trail of ops (P9)";
}

// Names an fp32 module set only when precision bisection found it.
std::string fp32_advice(const VerdictInputs& in) {
  switch (in.fp32_search) {
    case Fp32Search::found:
      return "keep " + comma_list(in.fp32_modules) +
             " in fp32 (autocast off inside; precision bisection: the smallest such set): train with "
             "--fp32-modules " +
             fp32_modules_flag_value(in.fp32_modules) + " (or --fallback auto, which finds such a set itself)";
    case Fp32Search::none_found:
      return "no set of modules in fp32 made the step finite, only the whole step in fp32 (the loss "
             "included): run the loss in fp32, or train in fp32";
    case Fp32Search::unsupported:
      return "the step is finite with autocast off; precision bisection could not switch this TorchScript "
             "model's modules to fp32 (the interpreter announced none of their frames), so it names no "
             "module set";
    case Fp32Search::not_run: break;
  }
  return "the step is finite with autocast off (precision bisection did not run)";
}

}  // namespace

Verdict decide(const VerdictInputs& in) {
  Verdict v;
  if (!in.birth) {
    v.verdict = format::Verdict::transient;
    v.category = format::Category::other;
    v.suggestion = "no birth was captured for this step";
    return v;
  }
  const format::Birth& b = *in.birth;
  v.category = probe::category_of(b);
  if (b.op.phase == format::Phase::input) {
    v.verdict = format::Verdict::data;
    v.suggestion = "drop sample " + std::to_string(b.sample) + " of the batch" +
                   (in.dataset_rows.empty() ? std::string() : " (data set row " + join_rows(in.dataset_rows) + ")") +
                   ": " + fix_for(v.category, b, in.precision);
    return v;
  }
  if (v.category == format::Category::all_targets_ignored) {
    // Degenerate data: finite inputs, nothing to average. No precision helps.
    v.verdict = format::Verdict::data;
    v.suggestion = fix_for(v.category, b, in.precision);
    return v;
  }
  if (in.repeats > 0 && in.reproduced == 0) {
    v.verdict = format::Verdict::transient;
    v.suggestion = "0 of " + std::to_string(in.repeats) +
                   " re-runs from the same state went non-finite: suspect non-determinism or the "
                   "hardware, not the math; set the determinism knobs (P19) and watch for a recurrence";
    return v;
  }
  if (in.fp32_finite) {
    v.verdict = format::Verdict::precision;
    v.suggestion = "finite in fp32: " + fp32_advice(in) +
                   (in.precision == format::Precision::fp16 ? ", or use bf16 instead of fp16 (P1, P10)" : " (P10)") +
                   ". " + fix_for(v.category, b, in.precision);
  } else {
    v.verdict = format::Verdict::model_or_data;
    // An overflow in fp32 after the grad norm rose for steps is the LR's doing (P12, P18).
    if (!in.grad_norm_trend.empty() &&
        (v.category == format::Category::overflow || v.category == format::Category::other))
      v.category = format::Category::grad_explosion;
    v.suggestion =
        "non-finite in fp32 too, so precision is not the cause: " + fix_for(v.category, b, format::Precision::fp32);
    if (!in.samples.empty())
      v.suggestion += ". Without batch row(s) " + join_rows(in.samples) + " the step is finite: inspect them";
  }
  // The rise's advice, unless the category's fix already gave it.
  if (!in.grad_norm_trend.empty())
    v.suggestion +=
        ". " + in.grad_norm_trend +
        (v.category == format::Category::grad_explosion ? "" : ": lengthen warmup or lower the LR (P12, P18)");
  return v;
}

std::string comma_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace nanscope::replay
