#include "nanscope/replay/verdict.hpp"

#include "nanscope/common/number_text.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/format/row_text.hpp"
#include "nanscope/probe/birth_category.hpp"
#include "nanscope/probe/input_producer.hpp"

#include <algorithm>
#include <map>

namespace nanscope::replay {

namespace {

std::string module_text(const std::string& module) { return module.empty() ? "the root module" : module; }

// Where the birth's op ran, as a fix names it: its module, and for a backward
// op what made its node: "the backward of GradPoison in blocks.1.norm", "a
// gradient hook at MulBackward0 (of aten::mul) in blocks.1.norm".
std::string birth_site(const format::Birth& b) {
  const bool recomputed = b.op.site == format::OpSite::recomputation;
  std::string site;
  if (b.op.phase != format::Phase::backward)
    site = module_text(b.op.module);
  else if (b.op.site == format::OpSite::gradient_hook)
    site = "a gradient hook at " + b.op.backward_node +
           (b.op.forward_op.empty() ? std::string() : " (of " + b.op.forward_op + ")") + " in " +
           module_text(b.op.module);
  else
    site = "the backward of " + (b.op.forward_op.empty() ? b.op.backward_node : b.op.forward_op) + " in " +
           module_text(b.op.module);
  return recomputed ? site + " (recomputed by activation checkpointing)" : site;
}

// The bare name of the op that made input `input` of the birth op, "" when the
// trail does not show it.
std::string producer_name(const format::Birth& b, const std::vector<format::OpRecord>& trail, size_t input) {
  const std::optional<format::OpRecord> producer = probe::input_producer(b, trail, input);
  return producer ? probe::bare_op_name(producer->op) : "";
}

// log(softmax(x)) and log(sigmoid(x)) have fused forms that never round to 0;
// any other input of a log (a standard deviation, an activation) is clamped.
std::string log_fix(const format::Birth& b, const std::vector<format::OpRecord>& trail,
                    const format::AdviceWords& words) {
  const std::string where = birth_site(b);
  const std::string op = probe::bare_op_name(b.op.op);
  const size_t arg = op == "xlogy" ? 1 : 0;  // xlogy(x, y) = x * log(y)
  const std::optional<format::OpRecord> producer = probe::input_producer(b, trail, arg);
  const std::string from = producer ? probe::bare_op_name(producer->op) : "";
  if (from == "softmax" || from == "_softmax")
    return b.op.op + " in " + where + " takes the log of a softmax whose output rounded to 0: use " +
           words.log_softmax + " (or " + words.cross_entropy + " on the logits) instead of log(softmax(x)) (P8)";
  if (from == "sigmoid")
    return b.op.op + " in " + where + " takes the log of a sigmoid whose output rounded to 0: use " + words.logsigmoid +
           " (or " + words.bce_with_logits + " on the logits) instead of log(sigmoid(x)) (P8)";
  // 1 - sigmoid(z) is sigmoid(-z), which rounds to 0 once z is large: a
  // hand-written binary cross-entropy's second term.
  const auto made_from = [&](double scale, double shift) {
    const std::optional<format::OpRecord> source =
        producer ? probe::affine_source(*producer, trail, scale, shift) : std::nullopt;
    return source ? probe::bare_op_name(source->op) : std::string();
  };
  if ((from == "rsub" || from == "sub") && made_from(-1, 1) == "sigmoid")
    return b.op.op + " in " + where + " takes the log of 1 - sigmoid(z), which rounds to 0 once z is large: it is " +
           "logsigmoid(-z), so use " + words.logsigmoid + "(-z) (or " + words.bce_with_logits +
           " on the logits for the whole cross-entropy) instead of log(1 - sigmoid(z)) (P8)";
  // log(exp(x) + 1), or log1p(exp(x)): softplus, which never overflows.
  if ((from == "add" && made_from(1, 1) == "exp") || (op == "log1p" && from == "exp"))
    return b.op.op + " in " + where + " takes the log of exp(x) + 1, whose exp overflows for large x: it is " +
           "softplus(x), so use " + words.softplus + "(x) instead (P8)";
  // log1p(x) = log(1 + x): its edge is -1, not 0.
  const bool log1p = op == "log1p";
  const double edge = log1p ? -1 : 0;
  const std::string floor = log1p ? "-1 + 1e-7" : "1e-7";
  const std::string code = op == "xlogy" ? "y.clamp_min(1e-7)" : "x.clamp_min(" + floor + ")." + op + "()";
  std::string text = (arg == 1 ? "the second input of " : "the input of ") + b.op.op + " in " + where;
  if (producer) text += " (the output of " + producer->op + ")";
  // Below the edge (NaN), only a clamp or a fix upstream helps; at it (-inf), eps does too.
  const std::optional<double> lowest = b.inputs.size() > arg ? std::optional(b.inputs[arg].min) : std::nullopt;
  if (lowest && *lowest < edge)
    return text + " went down to " + number_text(*lowest) + ": clamp it before the log (" + code +
           "), or fix what makes it " + (log1p ? "fall below -1" : "negative") + " (P8)";
  return text + (lowest && *lowest == edge ? " reached " + number_text(edge) : std::string()) + ": clamp it (" + code +
         ") or add eps inside the log (P8)";
}

// A divisor made by a standard deviation, variance or norm is 0 for a
// constant (or all-zero) row: the eps belongs inside it, as LayerNorm's and
// normalize's do. Any other divisor gets its eps where it is used.
std::string division_fix(const format::Birth& b, const std::vector<format::OpRecord>& trail) {
  static const std::map<std::string, std::string> eps_inside{{"sqrt", "(var + 1e-5).sqrt()"},
                                                             {"std", "(var + 1e-5).sqrt()"},
                                                             {"std_mean", "(var + 1e-5).sqrt()"},
                                                             {"var", "var + 1e-5"},
                                                             {"var_mean", "var + 1e-5"},
                                                             {"norm", "x.norm().clamp_min(1e-12)"},
                                                             {"linalg_vector_norm", "x.norm().clamp_min(1e-12)"},
                                                             {"frobenius_norm", "x.norm().clamp_min(1e-12)"}};
  const std::string where = birth_site(b);
  const std::string op = probe::bare_op_name(b.op.op);
  const std::string from = producer_name(b, trail, op == "div" ? 1 : 0);
  if (const auto fix = eps_inside.find(from); fix != eps_inside.end())
    return "the divisor of " + b.op.op + " in " + where + " comes from aten::" + from +
           " and held 0 (a constant or all-zero row): put the eps inside it, " + fix->second +
           ", as LayerNorm and normalize do (P8)";
  if (op == "rsqrt") return "add eps inside " + b.op.op + " in " + where + ": (x + 1e-5).rsqrt() (P8)";
  return "add eps to the divisor of " + b.op.op + " in " + where + " (a / (b + 1e-8)) (P8)";
}

// The playbook's fix for each category, the birth's arithmetic origin
// (docs/playbook.md P8, P10-P18), naming the module, in the words of whoever
// ran the loop.
std::string fix_for(format::Category category, const format::Birth& b, const VerdictInputs& in,
                    format::Precision precision) {
  const format::AdviceWords& words = format::advice_words(in.origin);
  const std::string where = birth_site(b);
  if (category == format::Category::log_nonpositive) return log_fix(b, in.trail, words);
  if (category == format::Category::sqrt_grad_zero)
    return "the gradient of sqrt at 0 is infinite: add eps inside the sqrt in " + module_text(b.op.module) +
           " ((x + 1e-12).sqrt()) (P8)";
  if (category == format::Category::div_by_zero) return division_fix(b, in.trail);
  if (category == format::Category::exp_overflow)
    // Whether the exp is a hand-written softmax the trail cannot say (what
    // follows the birth is not in it): both fixes, each for its case.
    return "exp overflows in " + where + ": if it is a softmax or log-sum-exp written by hand, use " + words.softmax +
           " / " + words.logsumexp + ", which subtract the max first; log(exp(x) + 1) is " + words.softplus +
           "(x); any other exp needs its exponent clamped " + "(x.clamp_max(" +
           (precision == format::Precision::fp16 ? "11" : "88") + ").exp()) (P8)";
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
    return std::string(
               "the batch itself holds a non-finite value: guard the data boundary, for each sample x at "
               "index i: ") +
           words.check_finite + " (P11)";
  return "inspect " + b.op.op + " in " + where + " with the snapshot's trail of ops (P9)";
}

// The precision the step computed in: its autocast's, or with autocast off
// a model's own 16-bit weights' (a float16 model overflows at float16's range).
format::Precision computed_in(const VerdictInputs& in) {
  if (in.precision != format::Precision::fp32 || in.own_16bit.empty()) return in.precision;
  return in.own_16bit == "float16" ? format::Precision::fp16 : format::Precision::bf16;
}

// Names an fp32 module set only when precision bisection found it; for a
// model of its own 16-bit weights, what the re-runs with them widened showed.
std::string fp32_advice(const VerdictInputs& in) {
  if (!in.own_16bit.empty()) {
    const std::string cause = "the model's own " + in.own_16bit +
                              " weights are the cause (the re-run widened them): keep the weights in float32 (load "
                              "or cast the model so)";
    if (in.precision == format::Precision::fp32)
      return cause + " and let autocast run the ops that are safe in 16 bits (" +
             format::how_to_set(in.origin, format::advice_words(in.origin).amp_bf16) + ")";
    const std::string amp = format::to_string(in.precision);
    if (in.widened_finite_at_amp.value_or(false))  // widened, under the step's own autocast: finite
      return cause + "; with them widened the step is finite under its " + amp + " autocast too, so keep that";
    return "only with the weights widened and autocast off both: widened under the step's " + amp +
           " autocast it is still non-finite, so keep the weights in float32 and replay the widened model to find "
           "the modules that need fp32";
  }
  switch (in.fp32_search) {
    case Fp32Search::found:
      return "keep " + comma_list(in.fp32_modules) +
             " in fp32 (autocast off inside; precision bisection: the smallest such set): " +
             format::how_to_set(in.origin, format::fp32_modules_setting(in.origin, in.fp32_modules)) + " (or " +
             format::advice_words(in.origin).fallback_auto + ", which finds such a set itself)";
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

// The region the search named, as the fix it was: that module run eagerly.
std::string compiled_region_advice(const VerdictInputs& in) {
  if (!in.compiled_region)
    return "Compare the compiled program with eager module by module (torch.compiler.disable on a module runs "
           "it eagerly)";
  if (in.compiled_region->empty())
    return "No module compiled alone breaks the step, only the whole model compiled together: try another "
           "backend (backend=\"aot_eager\" tells Dynamo's part from Inductor's) or run the model eagerly";
  const std::string& m = *in.compiled_region;
  return "Module '" + m +
         "' compiled alone breaks the step: run it eagerly (on the module you compiled, before "
         "torch.compile: sub = model.get_submodule('" +
         m + "'); sub.forward = torch.compiler.disable(sub.forward)), or try it in fp32 (" +
         format::how_to_set(in.origin, format::fp32_modules_setting(in.origin, {m})) + ")";
}

// How to name the update that broke the weights, as far as the run went.
std::string doom_search_advice(const VerdictInputs& in) {
  if (in.doom_search_answered) return "; the run's search for that update says what it found";
  if (in.doom_search_on) return "; the run searched for that update and named none for this step (its log says why)";
  return "; to name the update, " + format::how_to_set(in.origin, format::advice_words(in.origin).doom_search_on) +
         " (it replays the steps since a saved state, leaving updates out)";
}

}  // namespace

CauseEvidence cause_evidence(const VerdictInputs& in) {
  CauseEvidence e;
  e.birth = in.birth;
  e.nonfinite_weights = in.nonfinite_weights;
  e.repeats = in.repeats;
  e.reproduced = in.reproduced;
  e.eager_finite = in.eager_finite;
  e.kernel_choice = in.kernel_choice;
  e.kernels = in.kernels;
  e.fp32 = in.fp32_finite ? Fp32Rerun::finite : Fp32Rerun::nonfinite;
  e.rows.state = in.rows_searched || !in.samples.empty() ? RowSearch::State::ran : RowSearch::State::cannot_run;
  e.rows.breaking = in.samples;
  e.rows.out_of_range = in.rows_out_of_range;
  e.rows.why_not = in.rows_not_searched;
  e.rows.replaced = in.rows_replaced;
  e.grad_norm_rose = !in.grad_norm_trend.empty();
  return e;
}

namespace {

std::string comma_list_of_kernels(const std::vector<format::Kernel>& kernels) {
  std::string out;
  for (format::Kernel k : kernels) out += (out.empty() ? "" : ", ") + std::string(format::to_string(k));
  return out;
}

std::string reruns_text(const VerdictInputs& in) {
  return std::to_string(in.reproduced) + " of " + std::to_string(in.repeats) + " re-runs";
}

// A step non-finite every time with no op seen making it: the re-runs are
// the evidence, whether or not the capture saw the op that did it.
std::string unseen_birth_text(const VerdictInputs& in) {
  return "non-finite in " + reruns_text(in) + (in.fp32_finite ? " and finite in fp32" : " and in fp32 too") +
         ", yet no op was seen turning finite values into NaN/Inf: " +
         (!in.rerun_error.empty()
              ? "the re-run raised before one did (" + in.rerun_error + ")"
              : "the values were made where op-level capture cannot see (a fused or compiled kernel, a custom "
                "extension's op), or were non-finite before the step (the weights, buffers or batch)");
}

std::string precision_text(const VerdictInputs& in, const Verdict& v) {
  return "finite in fp32: " + fp32_advice(in) +
         (in.precision == format::Precision::fp16 && in.own_16bit.empty()  // else the weights are the advice
              ? ", or use bf16 instead of fp16: " +
                    format::how_to_set(in.origin, format::advice_words(in.origin).amp_bf16) + " (P1, P10)"
              : std::string(" (P10)")) +
         ". " + fix_for(v.category, *in.birth, in, computed_in(in));
}

// Non-finite in fp32 too: the op's fix, and what the row search said of the samples.
std::string model_or_data_text(const VerdictInputs& in, const Cause& cause, const Verdict& v) {
  const format::Birth& b = *in.birth;
  std::string text =
      "non-finite in fp32 too, so precision is not the cause: " + fix_for(v.category, b, in, format::Precision::fp32);
  if (cause.rule == CauseRule::trigger_rows) {
    const bool one = cause.rows.size() == 1;
    text += ". Without " + format::batch_rows_text(in.batch_rows, cause.rows) + " the step is finite" +
            (in.rows_replaced ? std::string(" (") + kRowsReplacedText + ")" : std::string()) + ", but " +
            (one ? "it is an ordinary sample" : "they are ordinary samples") + " (within " +
            number_text(kRowOutOfRangeFactor) + "x of the batch's range) on which " + trigger_text(b, in.trail) + ": " +
            (one ? "it triggers" : "they trigger") + " an op that is unsafe for such inputs, so fix the op; dropping " +
            (one ? "it" : "them") + " only waits for the next sample that drives it there";
  } else if (!b.rows.empty() && b.rows.size() < std::min(format::kBirthRowsKept, in.batch_rows.size())) {
    // Some rows, not all: the birth names the samples where batch bisection
    // could not (a model that draws random numbers) or found no single one.
    text += ". " + b.op.op + " made only " + format::batch_rows_text(in.batch_rows, b.rows) + " of " +
            std::to_string(in.batch_rows.size()) + " non-finite: inspect " + (b.rows.size() == 1 ? "it" : "them");
  }
  return text;
}

}  // namespace

Verdict decide(const VerdictInputs& in) {
  const Cause cause = cause_of(cause_evidence(in));
  Verdict v;
  v.verdict = cause.verdict.value_or(format::Verdict::model_or_data);
  v.category = cause.category;
  switch (cause.rule) {
    case CauseRule::compiled_program:
      // The same step, weights, batch, RNG state and precision: only the
      // program differs, so no fix of the model's math or data applies.
      v.suggestion = "non-finite in " + std::to_string(in.reproduced) + " of " + std::to_string(in.repeats) +
                     " compiled re-runs and finite when the same step runs eagerly: the compiled program is wrong, "
                     "not the model's math. " +
                     compiled_region_advice(in) + "; keep the snapshot for a bug report (it replays the step exactly)";
      return v;
    case CauseRule::kernel_differs: {
      // The same precision, weights and batch: only the kernel differs.
      const format::Kernel good = format::kernel_to_pin(*in.kernels);
      v.suggestion = "non-finite with " + std::string(format::to_string(in.kernels->used)) + " and finite with " +
                     comma_list_of_kernels(format::finite_kernels(*in.kernels)) +
                     " at the same precision, weights and batch (" + in.kernels->op +
                     "): the kernel is at fault, not the model's math or its data. Pin " + format::to_string(good) +
                     ": " + format::kernel_pin_code(good, *in.kernels, in.origin) + " (" +
                     format::how_to_set(in.origin, format::advice_words(in.origin).fallback_auto) +
                     " does it for the rest of the run); keep the snapshot for a bug report";
      return v;
    }
    case CauseRule::nonfinite_weights:
      v.suggestion = "the weights already held NaN/Inf as the step began (" +
                     format::weights_text(in.nonfinite_weights) +
                     "): no op of this step made them. An earlier update did (an LR spike, a loss spike through "
                     "an unclipped step, the optimizer's own arithmetic such as eps 0 over a zero second moment), "
                     "or they were loaded so. Go back to weights from before it" +
                     doom_search_advice(in);
      return v;
    case CauseRule::not_reproduced:
      v.suggestion = in.birth ? "0 of " + std::to_string(in.repeats) +
                                    " re-runs from the same state went non-finite: suspect non-determinism or the "
                                    "hardware, not the math; set the determinism knobs (P19) and watch for a recurrence"
                              : "no re-run from the same state went non-finite and no birth was captured: suspect "
                                "non-determinism or the hardware; set the determinism knobs (P19) and watch for a "
                                "recurrence";
      return v;
    case CauseRule::nonfinite_batch:
      v.suggestion = "drop " + format::batch_rows_text(in.batch_rows, {in.birth->sample}) + ": " +
                     fix_for(v.category, *in.birth, in, computed_in(in));
      return v;
    case CauseRule::no_counted_target:
      // Degenerate data: finite inputs, nothing to average. No precision helps.
      v.suggestion = fix_for(v.category, *in.birth, in, computed_in(in));
      return v;
    case CauseRule::rows_out_of_range:
      v.suggestion = "non-finite in fp32 too, and finite without " +
                     format::batch_rows_text(in.batch_rows, cause.rows) +
                     (cause.rows.size() == 1 ? ", whose values lie" : ", whose values lie each") + " over " +
                     number_text(kRowOutOfRangeFactor) +
                     "x outside the rest of the batch's (the median row's largest magnitude): drop " +
                     (cause.rows.size() == 1 ? "it" : "them") + " and find where the data pipeline made " +
                     (cause.rows.size() == 1 ? "it" : "them") + " (P11)";
      if (in.birth) v.suggestion += ". The op it broke: " + fix_for(v.category, *in.birth, in, format::Precision::fp32);
      return v;
    case CauseRule::fp32_rerun_raised:
    case CauseRule::finite_in_fp32:
    case CauseRule::trigger_rows:
    case CauseRule::every_row:
    case CauseRule::rows_not_searched: break;
  }
  if (!in.birth) {
    v.suggestion = unseen_birth_text(in);
    return v;
  }
  v.suggestion = v.verdict == format::Verdict::precision ? precision_text(in, v) : model_or_data_text(in, cause, v);
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
