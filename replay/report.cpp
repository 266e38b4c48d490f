#include "nanscope/replay/replay_report.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "nanscope/common/json_text.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/format/row_text.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::replay {

namespace {

std::string or_null(const std::string& s) { return s.empty() ? "null" : json_quoted(s); }

// The batch rows a birth names: those an op inside the model made
// non-finite, or the sample that arrived non-finite.
std::vector<int64_t> rows_of(const format::Birth& b) {
  if (!b.rows.empty() || b.sample < 0) return b.rows;
  return {b.sample};
}

// Batch rows' rows in the data set; null where unknown.
std::string dataset_rows_json(const std::vector<int64_t>& batch_rows, const std::vector<int64_t>& rows) {
  return list_json(rows, [&](int64_t r) {
    const std::optional<int64_t> row = format::dataset_row(batch_rows, r);
    return row ? std::to_string(*row) : std::string("null");
  });
}

std::string birth_json(const std::optional<format::Birth>& b, const std::vector<int64_t>& batch_rows) {
  if (!b) return "null";
  auto num = [](int64_t v) { return std::to_string(v); };
  std::ostringstream o;
  o << "{ \"op\": " << json_quoted(b->op.op) << ", \"phase\": " << json_quoted(format::to_string(b->op.phase))
    << ", \"module\": " << json_quoted(b->op.module) << ", \"kind\": " << json_quoted(format::to_string(b->kind))
    << ", \"backward_node\": " << or_null(b->op.backward_node) << ", \"forward_op\": " << or_null(b->op.forward_op)
    << ", \"site\": " << json_quoted(format::to_string(b->op.site))
    << ", \"sample\": " << (b->sample >= 0 ? std::to_string(b->sample) : "null")
    << ", \"micro_batch\": " << (b->micro_batch >= 0 ? std::to_string(b->micro_batch) : "null")
    << ", \"rows\": " << list_json(b->rows, num) << ", \"dataset_rows\": " << dataset_rows_json(batch_rows, rows_of(*b))
    << ", \"nan_count\": " << b->op.output.nan_count << ", \"inf_count\": " << b->op.output.inf_count
    << ", \"text\": " << json_quoted(format::birth_text(*b)) << " }";
  return o.str();
}

std::string birth_text(const std::optional<format::Birth>& b) { return b ? format::birth_text(*b) : "none"; }

std::string op_error_json(const format::OpError& e) {
  return "{ \"index\": " + std::to_string(e.op.index) + ", \"op\": " + json_quoted(e.op.op) +
         ", \"phase\": " + json_quoted(format::to_string(e.op.phase)) + ", \"module\": " + json_quoted(e.op.module) +
         ", \"backward_node\": " + or_null(e.op.backward_node) + ", \"max_abs\": " + json_number(e.max_abs) +
         ", \"max_rel\": " + json_number(e.max_rel) + ", \"ulps\": " + json_number(e.ulps) +
         ", \"nonfinite\": " + std::to_string(e.nonfinite) + " }";
}

// All of the trail: every op compared, and the first past the margin.
// {"op": ..., "used": "flash", "tried": {"math": "finite"}}, or null where none were tried.
std::string kernels_json(const std::optional<format::KernelTrials>& k) {
  if (!k) return "null";
  std::string tried;
  for (const format::KernelTrial& t : k->tried)
    tried += (tried.empty() ? "" : ", ") + json_quoted(format::to_string(t.kernel)) + ": " +
             json_quoted(format::to_string(t.outcome));
  return "{ \"op\": " + json_quoted(k->op) + ", \"used\": " + json_quoted(format::to_string(k->used)) +
         ", \"tried\": { " + tried + " } }";
}

std::string precision_trail_json(const std::optional<format::PrecisionTrail>& t) {
  if (!t) return "null";
  const bool found = t->first_lost >= 0;
  return "{ \"type\": " + json_quoted(t->type) + ", \"margin_ulps\": " + json_number(t->margin_ulps) +
         ",\n                       \"first_lost\": " +
         (found ? op_error_json(t->ops[size_t(t->first_lost)]) : std::string("null")) +
         ",\n                       \"first_lost_at\": " + (found ? std::to_string(t->first_lost) : "null") +
         ", \"unmatched\": " + std::to_string(t->unmatched) + ", \"cut_short\": " + or_null(t->cut_short) +
         ",\n                       \"text\": " + json_quoted(format::precision_lost_text(*t)) +
         ",\n                       \"ops\": " +
         list_json(t->ops, [](const format::OpError& e) { return "\n        " + op_error_json(e); }) + " }";
}

// The top of the trail: the first op past the margin, a few before it, and
// on to the birth.
std::string precision_trail_text(const format::PrecisionTrail& t) {
  std::ostringstream o;
  o << "  precision lost:   " << format::precision_lost_text(t) << "\n";
  const std::vector<size_t> shown = format::trail_rows_to_show(t);
  size_t next = 0;
  for (size_t i : shown) {
    if (i > next) o << "      ... " << i - next << " op(s)\n";
    o << "    " << (int64_t(i) == t.first_lost ? "> " : "  ") << format::op_error_text(t.ops[i]) << "\n";
    next = i + 1;
  }
  if (!t.cut_short.empty()) o << "    (" << t.cut_short << ")\n";
  return o.str();
}

// The report's last lines: the run's doom search on this step, and the verdict.
std::string verdict_text(const ReplayReport& r) {
  std::ostringstream o;
  if (!r.doomed_by.empty()) o << "  doomed by:        " << r.doomed_by << "\n";
  o << "verdict:    " << format::to_string(r.verdict.verdict) << "\n"
    << "category:   " << format::to_string(r.verdict.category) << "\n"
    << "suggestion: " << r.verdict.suggestion << "\n";
  return o.str();
}

}  // namespace

std::string to_json(const ReplayReport& r) {
  std::ostringstream o;
  auto str = [](const std::string& s) { return json_quoted(s); };
  auto num = [](int64_t v) { return std::to_string(v); };
  const std::vector<int64_t>& rows = r.evidence.batch_rows;
  o << "{ \"step\": " << r.step << ",\n"
    << "  \"capture\": { \"first_birth\": " << birth_json(r.capture.first_birth, rows)
    << ",\n               \"first_nan_birth\": " << birth_json(r.capture.first_nan_birth, rows)
    << ",\n               \"first_inf_birth\": " << birth_json(r.capture.first_inf_birth, rows) << " },\n"
    << "  \"replay\":  { \"nonfinite_weights\": " << list_json(r.evidence.nonfinite_weights, str)
    << ",\n               \"reproduced\": " << (r.evidence.reproduced > 0 ? "true" : "false")
    << ", \"reproduced_count\": " << r.evidence.reproduced << ", \"repeats\": " << r.evidence.repeats
    << ", \"fp32_finite\": " << (r.evidence.fp32_finite ? "true" : "false")
    << ", \"widened_weights\": " << or_null(r.evidence.own_16bit) << ",\n               \"eager_finite\": "
    << (r.evidence.eager_finite ? (*r.evidence.eager_finite ? "true" : "false") : "null")
    << ", \"compiled_region\": " << (r.evidence.compiled_region ? str(*r.evidence.compiled_region) : "null")
    << ",\n               \"fp32_first_birth\": " << birth_json(r.fp32_capture.first_birth, rows)
    << ",\n               \"anomaly\": " << or_null(r.anomaly)
    << ",\n               \"rerun_error\": " << or_null(r.rerun_error) << ",\n               \"precision_bisection\": "
    << (r.evidence.fp32_search != Fp32Search::not_run
            ? "{ \"fp32_modules\": " + list_json(r.evidence.fp32_modules, str) + " }"
            : "null")
    << ",\n               \"draws_random_numbers\": " << (r.draws_random_numbers ? "true" : "false")
    << ",\n               \"batch_bisection\": "
    << (r.batch_bisected ? "{ \"samples\": " + list_json(r.evidence.samples, num) +
                               ", \"dataset_rows\": " + dataset_rows_json(rows, r.evidence.samples) +
                               ", \"no_row_found\": " + or_null(r.no_row_found) + " }"
                         : "null")
    << ",\n               \"kernels\": " << kernels_json(r.evidence.kernels)
    << ",\n               \"precision_trail\": " << precision_trail_json(r.precision_trail) << " },\n"
    << "  \"doomed_by\": " << or_null(r.doomed_by) << ",\n"
    << "  \"verdict\": " << json_quoted(format::to_string(r.verdict.verdict)) << ",\n"
    << "  \"category\": " << json_quoted(format::to_string(r.verdict.category)) << ",\n"
    << "  \"suggestion\": " << json_quoted(r.verdict.suggestion) << " }\n";
  return o.str();
}

std::string to_text(const ReplayReport& r) {
  std::ostringstream o;
  const std::string ran_at = step_precision_name(r.evidence.precision, r.evidence.own_16bit);
  o << "step " << r.step << " (" << format::step_precision_text(r.evidence.precision, r.evidence.own_16bit) << ")\n"
    << "  first birth:      " << birth_text(r.capture.first_birth) << "\n";
  if (r.capture.first_birth && !rows_of(*r.capture.first_birth).empty()) {
    const std::vector<int64_t> at_birth = rows_of(*r.capture.first_birth);
    o << "  rows at birth:    " << format::batch_rows_text(r.evidence.batch_rows, at_birth)
      << (at_birth.size() >= format::kBirthRowsKept ? ", ... (the first " + std::to_string(at_birth.size()) + ")" : "")
      << "\n";
  }
  if (r.capture.first_nan_birth && r.capture.first_inf_birth)
    o << "  first NaN birth:  " << birth_text(r.capture.first_nan_birth) << "\n"
      << "  first Inf birth:  " << birth_text(r.capture.first_inf_birth) << "\n";
  if (!r.evidence.nonfinite_weights.empty()) {
    o << "  weights:          NaN/Inf in " << r.evidence.nonfinite_weights.size() << " parameter(s) as the step began ("
      << format::weights_text(r.evidence.nonfinite_weights) << "); not re-run\n";
    return o.str() + verdict_text(r);
  }
  o << "  re-run at " << ran_at << ":" << std::string(ran_at.size() < 6 ? 7 - ran_at.size() : 1, ' ')
    << "non-finite in " << r.evidence.reproduced << " of " << r.evidence.repeats << "\n"
    << "  re-run in fp32:   " << (r.evidence.fp32_finite ? "finite" : "non-finite")
    << (r.evidence.own_16bit.empty() ? "" : " (its " + r.evidence.own_16bit + " weights widened to float32)") << "\n";
  if (r.evidence.widened_finite_at_amp)
    o << "  re-run widened:   " << (*r.evidence.widened_finite_at_amp ? "finite" : "non-finite") << " at "
      << format::to_string(r.evidence.precision) << " with its weights in float32\n";
  if (r.evidence.eager_finite)  // a compiled model: the re-runs above ran its compiled program
    o << "  re-run eagerly:   "
      << (*r.evidence.eager_finite ? "finite (the compiled program alone goes non-finite)"
                                   : "non-finite (the model's own math)")
      << "\n";
  if (r.evidence.kernels) o << "  other kernels:    " << format::kernel_trials_text(*r.evidence.kernels) << "\n";
  if (r.evidence.compiled_region)
    o << "  compiled region:  "
      << (r.evidence.compiled_region->empty()
              ? "the whole model (no module compiled alone breaks the step)"
              : "module '" + *r.evidence.compiled_region + "' (compiled alone, it breaks the step)")
      << "\n";
  if (!r.evidence.fp32_finite)
    o << "  fp32 first birth: "
      << (r.fp32_capture.first_birth ? birth_text(r.fp32_capture.first_birth)
          : !r.rerun_error.empty()   ? "none before the re-run raised"
                                     : "none: no op turned finite values non-finite (the weights, buffers or "
                                       "batch held them already)")
      << "\n";
  if (!r.anomaly.empty()) o << "  anomaly mode:     " << r.anomaly << "\n";
  if (!r.rerun_error.empty()) o << "  re-run raised:    " << r.rerun_error << "\n";
  if (r.evidence.fp32_search != Fp32Search::not_run)
    o << "  fp32 needed in:   "
      << (r.evidence.fp32_search == Fp32Search::found ? comma_list(r.evidence.fp32_modules)
          : r.evidence.fp32_search == Fp32Search::unsupported
              ? "(not searched: the TorchScript model's module frames could not be switched)"
              : "(no module set found)")
      << "\n";
  if (r.evidence.rows_replaced && r.batch_bisected)
    o << "  batch bisection:  each row replaced by a copy of another, not removed (the step draws random numbers, "
         "or its samples are list items): every shape, so every draw, stays\n";
  if (!r.no_row_found.empty()) o << "  batch bisection:  no single row: " << r.no_row_found << "\n";
  if (r.batch_bisected && !r.evidence.samples.empty()) {
    o << "  finite without batch row(s):";
    for (size_t i = 0; i < r.evidence.samples.size(); ++i)
      o << " " << r.evidence.samples[i] << " ("
        << format::dataset_row_text(r.evidence.batch_rows, r.evidence.samples[i]) << ")";
    o << "\n";
  }
  if (r.precision_trail) o << precision_trail_text(*r.precision_trail);
  return o.str() + verdict_text(r);
}

void append_to_snapshot(const std::string& path, const ReplayReport& r) {
  format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind, /*writable=*/true);
  format::ReplayRecord record;
  record.verdict = r.verdict.verdict;
  record.category = r.verdict.category;
  record.suggestion = r.verdict.suggestion;
  record.reproduced_count = r.evidence.reproduced;
  record.repeats = r.evidence.repeats;
  record.fp32_finite = r.evidence.fp32_finite;
  record.anomaly = r.anomaly;
  record.fp32_modules = comma_list(r.evidence.fp32_modules);
  record.widened_weights = r.evidence.own_16bit;
  for (int64_t s : r.evidence.samples) record.samples += (record.samples.empty() ? "" : ",") + std::to_string(s);
  record.fp32_capture = r.fp32_capture;
  record.precision_trail = r.precision_trail;
  record.kernel_trials = r.evidence.kernels;
  format::write_replay_record(archive.root(), record);
  archive.close();
}

}  // namespace nanscope::replay
