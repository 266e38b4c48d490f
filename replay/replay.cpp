#include "nanscope/replay/replay.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "bisect.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/compiled_region.hpp"
#include "nanscope/core/kernel_switch.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/probe.hpp"
#include "nanscope/probe/tensor_io.hpp"
#include "rebuild.hpp"
#include "trace_precision.hpp"

namespace nanscope::replay {

namespace {

// A watched step of several micro-batches snapshots one of them: births in
// its re-runs carry that micro-batch's number, as the training run's did.
int64_t micro_batch_of(const std::map<std::string, std::string>& config) {
  auto it = config.find("micro_batch");
  return it == config.end() ? -1 : std::stoll(it->second);
}

// fp32 with LibTorch's own anomaly detection: its message names the first
// backward function that returned NaN.
std::string anomaly_message(ReplaySetup& setup) {
  compat::WarningCollector warnings;  // anomaly mode reports the forward trace as a warning
  // Anomaly mode raises at the first backward function that returns NaN:
  // that is its finding, not a re-run that failed, so the re-run's own error
  // (setup.rerun_error, what a report calls "the re-run raised") is kept as it was.
  const std::string before = setup.rerun_error;
  setup.rerun_error.clear();
  {
    torch::autograd::DetectAnomalyGuard anomaly;
    step_is_finite_in_fp32(setup, setup.snapshot.batch);
  }
  std::string raised = std::exchange(setup.rerun_error, before);
  std::string message;
  for (const auto& w : warnings.messages())
    if (message.empty() && w.find("should be enabled only for debugging") == std::string::npos) message = w;
  if (message.empty()) message = raised;
  // One line: the first line of the message.
  if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
  return message;
}

// Anomaly mode promises "Traceback of forward call that caused the error:"
// and, from C++, has none to give. Say instead which forward op and module
// made the failing node, when the capture saw that node; else end the sentence.
std::string with_forward_origin(std::string message, const format::Capture& capture) {
  const std::string promise = " Traceback of forward call that caused the error:";
  if (message.size() >= promise.size() &&
      message.compare(message.size() - promise.size(), promise.size(), promise) == 0)
    message.resize(message.size() - promise.size());
  const std::string prefix = "Error detected in ";
  if (message.rfind(prefix, 0) != 0) return message;
  const std::string node = message.substr(prefix.size(), message.find('.') - prefix.size());
  // The node that returned a non-finite value: a birth's before any trail op
  // of that name (an earlier layer's node of the same kind), and the latest of those.
  std::vector<format::OpRecord> seen;
  for (const auto* b : {&capture.first_nan_birth, &capture.first_inf_birth, &capture.first_birth})
    if (*b) seen.push_back((*b)->op);
  seen.insert(seen.end(), capture.trail.rbegin(), capture.trail.rend());
  for (const format::OpRecord& op : seen)
    if (op.backward_node == node && !op.forward_op.empty())
      return message + " It is the backward of " + op.forward_op + " in module '" + op.module + "'.";
  return message;
}

// "grad norm 1.2 at step 10 -> 4.4e+06 at step 12 (x3.7e+06 over 2 steps)"
// when the run file that wrote the snapshot sits beside its snapshots/ folder
// (run.h5, or run-rank-R.h5 for a rank's snapshot) and the norm rose 10x or more.
std::string grad_norm_trend(const std::string& snapshot_path, int64_t step) {
  namespace fs = std::filesystem;
  const fs::path run = format::run_file_beside_snapshot(snapshot_path);
  if (run.empty() || !fs::exists(run)) return "";
  try {
    format::RunData r = format::read_run(run.string());
    int64_t first = -1, last = -1;
    for (size_t i = 0; i < r.rows(); ++i) {
      if (r.step[i] >= step || r.skipped[i] || !std::isfinite(r.grad_norm[i])) continue;
      if (r.step[i] >= step - 10) {
        if (first < 0) first = int64_t(i);
        last = int64_t(i);
      }
    }
    if (first < 0 || last <= first || r.grad_norm[first] <= 0) return "";
    const double rise = r.grad_norm[last] / r.grad_norm[first];
    if (rise < 10) return "";
    std::ostringstream s;
    s << run.filename().string() << ": grad norm " << r.grad_norm[first] << " at step " << r.step[first] << " -> "
      << r.grad_norm[last] << " at step " << r.step[last] << " (x" << rise << ") before this step";
    return s.str();
  } catch (const format::FormatError&) {
    return "";
  }
}

// The run's `doom` event about this step, when run.h5 sits beside the
// snapshot and the run searched (--doom-search on): "step 45 doomed step 55:
// ...", or why no earlier step did; "" otherwise.
std::string doom_of(const std::string& snapshot_path, int64_t step) {
  namespace fs = std::filesystem;
  const fs::path run = format::run_file_beside_snapshot(snapshot_path);
  if (run.empty() || !fs::exists(run)) return "";
  try {
    const format::RunData r = format::read_run(run.string());
    for (const format::RunEvent& e : r.events)
      if (e.kind == format::EventKind::doom && format::doomed_step(e.text) == step) return e.text;
  } catch (const format::FormatError&) {}
  return "";
}

// The verdict on what was established, with what the run beside the
// snapshot says of this step.
void conclude(ReplayReport& report, const std::string& snapshot) {
  report.evidence.birth = report.capture.first_birth;
  report.evidence.trail = report.capture.trail;
  report.evidence.grad_norm_trend = grad_norm_trend(snapshot, report.step);
  report.doomed_by = doom_of(snapshot, report.step);
  report.evidence.doom_search_answered = !report.doomed_by.empty();
  report.evidence.rerun_error = report.rerun_error;
  report.verdict = decide(report.evidence);
}

// The report as the snapshot alone gives it: the step, its precision,
// origin, capture and batch rows, and weights already non-finite.
ReplayReport begin_report(const ReplaySetup& setup) {
  const probe::SnapshotContents& s = setup.snapshot;
  ReplayReport report;
  report.step = s.step;
  report.evidence.precision = s.precision;
  report.evidence.own_16bit = setup.model->own_16bit_type_name();
  report.evidence.origin = s.origin;
  report.capture = s.capture;
  if (s.batch_rows.defined()) {
    report.evidence.batch_rows = probe::long_values(s.batch_rows);
  } else {
    // The batch's size, its data set rows unknown.
    report.evidence.batch_rows.assign(size_t(s.batch.rows()), -1);
  }
  // Weights that held the NaN/Inf as the step began are not re-run: the value
  // was born before the step (an earlier update, or the weights as loaded),
  // so nothing a re-run from them names is its birth. The guard checked them
  // itself; an older snapshot's are read here (where a closure optimizer's
  // NaN trial point would read as an earlier update's: 1.8 cannot tell).
  report.evidence.nonfinite_weights =
      s.weights_checked ? s.capture.nonfinite_weights : nonfinite_parameters(*setup.model);
  if (auto it = s.config.find("doom_search"); it != s.config.end()) report.evidence.doom_search_on = it->second == "on";
  return report;
}

probe::CaptureOptions capture_options(const probe::SnapshotContents& s, size_t trail_length, int64_t micro_batch) {
  return {trail_length, /*batch_size=*/s.batch.rows() > 0 ? s.batch.rows() : -1, /*row_dim=*/s.batch.row_dim,
          micro_batch};
}

// 1. At the original precision and loss scale, `repeats` times. A re-run
// that raised proves nothing by itself: it counts as non-finite only where
// something seen before the exception was (the batch holding the NaN/Inf,
// or a birth under capture), and a replay whose re-runs all raised with
// nothing seen has no verdict to give.
void rerun_at_its_precision(ReplaySetup& setup, ReplayReport& report, int repeats) {
  const probe::SnapshotContents& s = setup.snapshot;
  report.evidence.repeats = std::max(1, repeats);
  int raised = 0;
  for (int i = 0; i < report.evidence.repeats; ++i) {
    const bool finite = step_is_finite(setup, setup.amp, s.batch);
    if (setup.last_raised)
      ++raised;
    else if (!finite)
      ++report.evidence.reproduced;
    if (i == 0 && s.cpu_rng_state.defined())  // step_is_finite started the generator from this state
      report.draws_random_numbers = !at::equal(at::detail::getDefaultCPUGenerator().get_state(), s.cpu_rng_state);
  }
  if (raised == 0) return;
  const std::string error = setup.rerun_error;
  bool born_before_raising = probe::Probe::input_capture({s.batch}).first_birth.has_value();
  if (!born_before_raising) {
    probe::OpCapture capture(capture_options(s, /*trail_length=*/0, /*micro_batch=*/-1));
    step_is_finite(setup, setup.amp, s.batch);
    born_before_raising = capture.result().first_birth.has_value();
  }
  if (!born_before_raising) {
    if (report.evidence.reproduced == 0)
      throw std::runtime_error("no verdict: every re-run of step " + std::to_string(s.step) +
                               " raised before any NaN or Inf was born (" + error +
                               "); does this program's model and loss take the snapshot's batch?");
    report.evidence.repeats -= raised;  // the runs that ran are the evidence
  } else {
    report.evidence.reproduced += raised;  // non-finite before they raised
  }
  setup.rerun_error = error;
}

// 1b. A compiled model: the re-runs ran its compiled program. Once more
// eagerly (capture on), at the same precision: a birth the compiled program
// hid is named there; finite there is the compiler's doing, and the module
// that breaks the step compiled alone is searched for. Returns the eager
// capture (none for an eager model).
std::optional<format::Capture> rerun_eagerly(ReplaySetup& setup, ReplayReport& report) {
  const probe::SnapshotContents& s = setup.snapshot;
  if (!setup.model->compiled() || report.evidence.reproduced == 0) return std::nullopt;
  std::optional<format::Capture> eager_capture;
  {
    probe::OpCapture capture(capture_options(s, /*trail_length=*/32, micro_batch_of(s.config)));
    report.evidence.eager_finite = step_is_finite(setup, setup.amp, s.batch);
    eager_capture = capture.result();
  }
  // Capture off again: the search's steps run compiled.
  if (*report.evidence.eager_finite) {
    const CompiledCheck check =
        check_compiled_program(*setup.model, [&] { return !step_is_finite(setup, setup.amp, s.batch); });
    if (check.region) report.evidence.compiled_region = check.region->module;
  }
  return eager_capture;
}

// 1c. The born op's other kernels (attention's backends, oneDNN on the
// CPU), at the same precision: a step finite with one of them is that
// kernel's doing (the verdict `kernel`). A compiled model's step is not
// asked: its kernels are the compiler's.
void rerun_with_other_kernels(ReplaySetup& setup, ReplayReport& report) {
  const probe::SnapshotContents& s = setup.snapshot;
  if (!s.capture.first_birth || report.evidence.reproduced == 0 || setup.model->compiled()) return;
  const bool cpu = setup.parameters.empty() || setup.parameters.front().device().is_cpu();
  report.evidence.kernel_choice = switchable_kernels(*s.capture.first_birth, cpu);
  if (!report.evidence.kernel_choice) return;
  const std::string step_error = std::exchange(setup.rerun_error, {});
  report.evidence.kernels = try_kernels(
      *report.evidence.kernel_choice, [&] { return step_is_finite(setup, setup.amp, s.batch); },
      [&] { return setup.last_raised; });
  setup.rerun_error = step_error;
}

// 2. In fp32, under op-level capture, then under anomaly detection.
void rerun_in_fp32(ReplaySetup& setup, ReplayReport& report) {
  const probe::SnapshotContents& s = setup.snapshot;
  const bool batch_holds_it = probe::Probe::input_capture({s.batch}).first_birth.has_value();
  std::optional<bool> fp32_read_batch;  // whether what failed came from the batch's NaN/Inf
  {
    probe::OpCapture capture(capture_options(s, /*trail_length=*/32, micro_batch_of(s.config)));
    report.evidence.fp32_finite = step_is_finite_in_fp32(setup, s.batch);
    report.fp32_capture = capture.result();
    fp32_read_batch = capture.failure_read_batch();
    if (setup.last_raised && !report.fp32_capture.first_birth && !batch_holds_it)
      throw std::runtime_error("no verdict: the fp32 re-run of step " + std::to_string(s.step) +
                               " raised before any NaN or Inf was born (" + setup.rerun_error +
                               "), so nothing says whether precision is the cause");
  }
  // A batch that holds the NaN/Inf itself is the birth at every precision,
  // whatever the re-run did after it (as the guard's own capture has it),
  // unless what failed never came from it (a leaf the step does not read).
  const format::Capture input = probe::Probe::input_capture({s.batch});
  const bool not_read = s.capture.batch_not_read || (fp32_read_batch == false && report.fp32_capture.first_birth);
  if (input.first_birth && not_read) {
    report.fp32_capture.batch_not_read = true;
    report.fp32_capture.discarded.insert(report.fp32_capture.discarded.begin(), format::birth_text(*input.first_birth));
  } else if (input.first_birth) {
    report.fp32_capture.first_birth = input.first_birth;
    (input.first_birth->kind == format::BirthKind::nan ? report.fp32_capture.first_nan_birth
                                                       : report.fp32_capture.first_inf_birth) = input.first_birth;
  }
  if (!report.evidence.fp32_finite) report.anomaly = with_forward_origin(anomaly_message(setup), report.fp32_capture);
  // A model of its own 16-bit weights whose step ran under autocast: the fp32
  // re-run widened the weights and turned autocast off; once more with only
  // the weights widened says which of the two it took (a re-run that raised says nothing).
  if (report.evidence.fp32_finite && !report.evidence.own_16bit.empty() && setup.amp != Amp::fp32) {
    const std::string step_error = std::exchange(setup.rerun_error, {});
    const bool finite = step_is_finite_widened(setup, setup.amp, s.batch);
    if (!setup.last_raised) report.evidence.widened_finite_at_amp = finite;
    setup.rerun_error = step_error;
  }
  report.rerun_error = setup.rerun_error;
}

// 3b. The rows without which the step is finite.
void search_rows(ReplaySetup& setup, ReplayReport& report) {
  const probe::SnapshotContents& s = setup.snapshot;
  if (s.batch.rows() <= 1) {
    report.evidence.rows_not_searched = "the row search cannot run on a batch of one row";
    return;
  }
  report.batch_bisected = true;
  const std::string step_error = std::exchange(setup.rerun_error, {});  // the step's own, quoted as such
  report.evidence.rows_replaced = report.draws_random_numbers || s.batch.sample_lists().rows > 0;
  report.evidence.samples = samples_without_which_finite(setup, report.evidence.rows_replaced);
  report.evidence.rows_searched = setup.rerun_error.empty();
  if (report.evidence.samples.empty())
    report.no_row_found =
        setup.rerun_error.empty()
            ? "the step stays non-finite without any one of its " + std::to_string(s.batch.rows()) + " rows"
            : "the loss function failed on the batch without a row (" + setup.rerun_error +
                  "): each of its tensors needs the rows along row_dim (a 1-D one is taken as a flattened "
                  "(rows, m) target, or (m, rows) with row_dim 1)";
  if (!report.evidence.rows_searched) report.evidence.rows_not_searched = report.no_row_found;
  report.evidence.rows_out_of_range = s.batch.rows_out_of_range(report.evidence.samples, kRowOutOfRangeFactor);
  setup.rerun_error = step_error;
}

// 3. Bisections, where they can say something: 3a. the smallest set of
// modules that makes the step finite in fp32, 3b. the rows.
void bisect(ReplaySetup& setup, ReplayReport& report, bool asked) {
  if (!asked || report.evidence.reproduced == 0) {
    report.evidence.rows_not_searched = "the row search was not asked for (--no-bisect)";
    return;
  }
  const probe::SnapshotContents& s = setup.snapshot;
  const bool input_birth = s.capture.first_birth && s.capture.first_birth->op.phase == format::Phase::input;
  // Modules "in fp32" are autocast off inside: a model of its own 16-bit
  // weights computes in them there too, so it has no such set to find.
  if (report.evidence.fp32_finite && setup.amp != Amp::fp32 && !input_birth && report.evidence.own_16bit.empty()) {
    const Fp32RegionSearch search = smallest_fp32_region(setup);
    report.evidence.fp32_search = search.outcome;
    report.evidence.fp32_modules = search.modules;
  }
  search_rows(setup, report);
}

}  // namespace

ReplayReport replay_snapshot(const ReplayOptions& options) {
  ReplaySetup setup = rebuild(options.snapshot);
  ReplayReport report = begin_report(setup);
  if (!report.evidence.nonfinite_weights.empty()) {
    conclude(report, options.snapshot);
    return report;
  }
  rerun_at_its_precision(setup, report, options.repeats);
  const std::optional<format::Capture> eager_capture = rerun_eagerly(setup, report);
  rerun_with_other_kernels(setup, report);
  rerun_in_fp32(setup, report);
  bisect(setup, report, options.bisect);
  // The training run's re-run of a compiled model may have seen no op (or
  // none of this one's eager re-run): the eager birth is the evidence then.
  const probe::SnapshotContents& s = setup.snapshot;
  if (!s.capture.first_birth && eager_capture && eager_capture->first_birth) report.capture = *eager_capture;
  conclude(report, options.snapshot);
  // 4. Where precision was lost, for a step that is finite in fp32 only.
  if (report.verdict.verdict == format::Verdict::precision && !setup.model->compiled())
    report.precision_trail = trace_precision(setup);
  return report;
}

}  // namespace nanscope::replay
