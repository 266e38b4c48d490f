#include "nanscope/core/remedy.hpp"

#include <chrono>
#include <limits>

#include "nanscope/common/error_text.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/kernel_switch.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/probe/birth_category.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

namespace {

// The precision search's trial over the live re-runs, on top of the modules already in fp32.
class LiveFp32Trial : public Fp32Trial {
 public:
  LiveFp32Trial(StepReruns& reruns, Amp amp, std::vector<std::string> already)
      : reruns_(reruns), amp_(amp), already_(std::move(already)) {}
  std::vector<std::string> modules() override {
    std::vector<std::string> out;
    for (auto& m : reruns_.modules_seen())
      if (std::find(already_.begin(), already_.end(), m) == already_.end()) out.push_back(m);
    return out;
  }
  bool finite_with(const std::vector<std::string>& modules) override {
    return reruns_.finite(amp_, with_already(modules));
  }
  bool unswitchable() const override { return reruns_.unswitchable(); }
  std::vector<std::string> with_already(const std::vector<std::string>& modules) const {
    std::vector<std::string> all = already_;
    all.insert(all.end(), modules.begin(), modules.end());
    return all;
  }

 private:
  StepReruns& reruns_;
  Amp amp_;
  std::vector<std::string> already_;
};

std::string rows_text(const std::vector<int64_t>& rows) {
  std::string list;
  for (int64_t r : rows) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return (rows.size() == 1 ? "batch row " : "batch rows ") + list;
}

std::string rows_tested_text(const std::vector<int64_t>& rows, bool replaced) {
  return "finite without " + rows_text(rows) + (replaced ? std::string(" (") + kRowsReplacedText + ")" : std::string());
}

// The rows without which the step is finite, and of them the rows out of
// the batch's range; or why the search cannot run. A search in which every
// re-run raised says nothing either.
RowSearch search_rows(const FailedStep& failed, StepReruns& reruns) {
  RowSearch search;
  search.state = RowSearch::State::cannot_run;
  if (failed.batch_size == 0) {
    search.why_not =
        "the row search cannot run: the closure runs its own batch only (give a loss function of the batch)";
    return search;
  }
  if (failed.batch_size == 1) {
    search.why_not = "the row search cannot run on a batch of one row: nothing tells the sample from the model";
    return search;
  }
  // A larger batch is searched among the rows its birth's op made non-finite
  // (at most 16, one re-run each), not row by row.
  std::vector<int64_t> candidates;
  const bool every_row = failed.batch_size <= kMaxRowsSearched;
  if (every_row) {
    for (int64_t row = 0; row < failed.batch_size; ++row) candidates.push_back(row);
  } else if (failed.capture && failed.capture->first_birth) {
    for (int64_t row : failed.capture->first_birth->rows)
      if (row >= 0 && row < failed.batch_size) candidates.push_back(row);
  }
  const std::string too_large = "the batch has " + std::to_string(failed.batch_size) + " rows (batches of up to " +
                                std::to_string(kMaxRowsSearched) + " are searched row by row)";
  if (candidates.empty()) {
    search.why_not = "the row search did not run: " + too_large + " and the birth names no row";
    return search;
  }
  if (const std::string ambiguous = reruns.ambiguous_rows(); !ambiguous.empty()) {
    search.why_not = "the row search cannot run: " + ambiguous;
    return search;
  }
  // A step that draws random numbers (dropout) would draw different ones
  // after a removed row: each row is replaced by a copy of another instead,
  // one the birth does not name, so every shape and every draw stay.
  search.replaced = reruns.draws_random_numbers() || reruns.rows_are_list_items();
  const std::vector<int64_t> birth_rows =
      failed.capture && failed.capture->first_birth ? failed.capture->first_birth->rows : std::vector<int64_t>{};
  int64_t raised = 0;
  std::string error;
  std::vector<int64_t> found;
  for (int64_t row : candidates) {
    const bool finite = search.replaced ? reruns.finite_with_row_replaced(failed.amp, failed.fp32_modules, row,
                                                                          donor_row(row, failed.batch_size, birth_rows))
                                        : reruns.finite(failed.amp, failed.fp32_modules, row);
    if (finite) found.push_back(row);
    if (reruns.raised()) {
      ++raised;
      if (error.empty()) error = reruns.last_error();
    }
  }
  if (found.empty() && raised == int64_t(candidates.size())) {
    search.why_not = "the row search could not run: the loss raised on the batch without a row (" + error +
                     "); name each tensor's row dimension (row_dims; Python: row_dim=)";
    return search;
  }
  if (found.empty() && !every_row) {
    search.why_not =
        "the row search tried the rows the birth names alone, and the step stayed non-finite without "
        "each; " +
        too_large;
    return search;
  }
  search.state = RowSearch::State::ran;
  // Finite without any one row: the batch's size, not a sample, is what matters.
  if (int64_t(found.size()) < failed.batch_size) search.breaking = found;
  if (!search.breaking.empty()) search.out_of_range = reruns.rows_out_of_range(search.breaking);
  return search;
}

// Median seconds of three re-runs with each module set, alternated so both see the same machine.
std::pair<double, double> rerun_seconds(StepReruns& reruns, Amp amp, const std::vector<std::string>& before,
                                        const std::vector<std::string>& after) {
  std::vector<double> a, b;
  auto timed = [&](const std::vector<std::string>& modules) {
    const auto start = std::chrono::steady_clock::now();
    reruns.finite(amp, modules);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (int i = 0; i < 3; ++i) {
    a.push_back(timed(before));
    b.push_back(timed(after));
  }
  return {median(a), median(b)};
}

// What the precision search found, as the remedy: the smallest module set
// in fp32, or the whole fallback when none (or no birth to search from).
void precision_remedy(RemedyChoice& choice, const FailedStep& failed, StepReruns& reruns) {
  const auto& birth = failed.capture->first_birth;
  if (!birth) {
    // Non-finite again with no op seen making it (a compiled kernel): no
    // module to start a search from, so the whole model goes to fp32.
    choice.why = "finite with autocast off; no birth was seen to search the modules from";
    return;
  }
  LiveFp32Trial trial(reruns, failed.amp, failed.fp32_modules);
  const std::vector<std::string> found = minimal_fp32_modules(trial, birth->op.module);
  if (found.empty()) {
    choice.why = "finite with autocast off, but no set of modules in fp32 is";
    return;
  }
  choice.remedy = Remedy::fp32_modules;
  choice.modules = found;
  choice.why = "finite with " + fp32_modules_flag_value(found) + " in fp32";
  std::tie(choice.seconds_before, choice.seconds_after) =
      rerun_seconds(reruns, failed.amp, failed.fp32_modules, trial.with_already(found));
}

// What the evidence is before any re-run of the diagnosis: the batch's own
// check and the forensic re-run's capture (one re-run of the step).
CauseEvidence first_evidence(const FailedStep& failed) {
  CauseEvidence e;
  e.batch_nonfinite = !failed.batch_finite;
  if (failed.capture) {
    const format::Capture& capture = *failed.capture;
    e.birth = capture.first_birth;
    e.nonfinite_weights = capture.nonfinite_weights;
    e.repeats = 1;
    e.reproduced = capture.first_birth || capture.reproduced || capture.compiled_only ? 1 : 0;
    if (capture.compiled_only) e.eager_finite = true;
  }
  // A step at fp32 is its own fp32 re-run. A model of its own 16-bit weights
  // computes in them with autocast off too: that re-run is no fp32 one
  // (widening a copy of the weights would double their memory mid-run;
  // nanscope-replay does it).
  if (e.birth && failed.kernels_tried) e.kernel_choice = switchable_kernels(*e.birth, failed.on_cpu);
  if (!failed.own_16bit.empty())
    e.fp32 = Fp32Rerun::unknown;
  else if (failed.amp == Amp::fp32)
    e.fp32 = Fp32Rerun::nonfinite;
  return e;
}

// The rules' cause, with the evidence they asked for gathered by re-runs;
// `fp32_error`: what the fp32 re-run raised, if it did.
Cause diagnosed_cause(const FailedStep& failed, StepReruns& reruns, CauseEvidence& e, std::string& fp32_error) {
  for (;;) {
    const std::variant<Cause, EvidenceNeeded> c = classify_cause(e);
    if (const Cause* cause = std::get_if<Cause>(&c)) return *cause;
    switch (std::get<EvidenceNeeded>(c)) {
      case EvidenceNeeded::kernel_reruns:
        e.kernels = try_kernels(
            *e.kernel_choice, [&] { return reruns.finite(failed.amp, failed.fp32_modules); },
            [&] { return reruns.raised(); });
        break;
      case EvidenceNeeded::fp32_rerun: {
        const bool finite = reruns.finite(Amp::fp32, {});
        e.fp32 = reruns.raised() ? Fp32Rerun::raised : finite ? Fp32Rerun::finite : Fp32Rerun::nonfinite;
        fp32_error = reruns.last_error();
        break;
      }
      case EvidenceNeeded::row_search: e.rows = search_rows(failed, reruns); break;
    }
  }
}

// A gradient norm past the float range is no op's fault: the gradients
// are that large because an earlier update grew the weights (or the LR is
// too high for them), and the norm of the next batch overflows whichever
// sample it holds. The cause is before this step.
constexpr const char* kGradientsExplode =
    "the gradients explode (their norm passes the float range): an earlier update grew the weights, or the LR "
    "is too high for them; lower the LR or lengthen warmup and clip the global norm, and let the doom search "
    "(doom_search) name the update that doomed the step";

// The words after "non-finite with autocast off too" for a step the rows
// (or the model) fail: what the row search found, or why it did not run.
std::string model_or_data_text(const Cause& cause, const CauseEvidence& e, const FailedStep& failed) {
  std::string text = !failed.own_16bit.empty() ? "non-finite in the model's own " + failed.own_16bit + " weights"
                     : failed.amp == Amp::fp32 ? "non-finite at fp32"
                                               : "non-finite with autocast off too";
  switch (cause.rule) {
    case CauseRule::trigger_rows:
      return text + "; " + rows_tested_text(cause.rows, e.rows.replaced) + ", " +
             (cause.rows.size() == 1 ? "an ordinary sample" : "ordinary samples") + " (within " +
             number_text(kRowOutOfRangeFactor) + "x of the batch's range) on which " +
             trigger_text(*e.birth, failed.capture->trail) +
             (cause.category == format::Category::grad_explosion
                  ? ": not the data; " + std::string(kGradientsExplode)
                  : ": fix the op, not the data (nanscope-replay gives the fix)");
    case CauseRule::every_row:
      return text + ", whichever batch row is left out" +
             (cause.fp32_unknown ? "" : ": not one sample, and not precision") +
             (cause.category == format::Category::grad_explosion ? "; " + std::string(kGradientsExplode) : "");
    case CauseRule::rows_not_searched: return text + "; " + e.rows.why_not;
    default: return text;
  }
}

// What each rule of the cause calls for, in words that give its evidence.
RemedyChoice remedy_for(const Cause& cause, const CauseEvidence& e, const FailedStep& failed, StepReruns& reruns,
                        const std::string& fp32_error) {
  RemedyChoice choice;
  choice.cause = cause;
  switch (cause.rule) {
    case CauseRule::nonfinite_weights:
      choice.remedy = Remedy::skip_model_or_data;
      choice.why = "the weights held NaN/Inf as the step began (" + format::weights_text(e.nonfinite_weights) + ")";
      break;
    case CauseRule::compiled_program:
      // Eager is finite: no precision or row of the model's math is at fault.
      choice.remedy = Remedy::skip_compiler;
      choice.why = format::capture_text(*failed.capture);
      break;
    case CauseRule::not_reproduced:
      choice.remedy = Remedy::skip_transient;
      choice.why = "the re-run of the same step was finite";
      break;
    case CauseRule::nonfinite_batch:
      choice.remedy = Remedy::skip_data;
      choice.why =
          !failed.batch_finite ? "the batch holds a non-finite value" : "the birth is the data's (nonfinite_input)";
      break;
    case CauseRule::no_counted_target:
      choice.remedy = Remedy::skip_data;
      choice.why = "the birth is the data's (all_targets_ignored)";
      break;
    case CauseRule::kernel_differs:
      // The same precision, weights and batch: only the kernel differs.
      choice.remedy = Remedy::kernel;
      choice.kernel = format::kernel_to_pin(*e.kernels);
      choice.kernel_trials = e.kernels;
      choice.modules = {e.birth->op.module};
      choice.why = e.kernels->op + ": " + format::kernel_trials_text(*e.kernels);
      break;
    case CauseRule::fp32_rerun_raised:
      choice.remedy = Remedy::skip_undiagnosed;
      choice.why = "the re-run with autocast off raised (" + fp32_error + "), so nothing says what to change";
      break;
    case CauseRule::finite_in_fp32: precision_remedy(choice, failed, reruns); break;
    case CauseRule::rows_out_of_range:
      choice.remedy = Remedy::skip_data;
      choice.why = rows_tested_text(cause.rows, e.rows.replaced) + ", out of the batch's range (over " +
                   number_text(kRowOutOfRangeFactor) + "x the median row's largest value)";
      break;
    case CauseRule::every_row:
    case CauseRule::rows_not_searched:
      // No fp32 re-run could be made and no sample is named: the stock
      // fallback, which for such a model is its LR cut alone (its weights stay 16-bit).
      if (cause.fp32_unknown) {
        choice.why =
            "non-finite in the model's own " + failed.own_16bit +
            " weights (no fp32 re-run: widen them to fp32 to try one, or replay the snapshot)" +
            (cause.rule == CauseRule::rows_not_searched ? "; " + e.rows.why_not : "; not one batch row's doing");
        break;
      }
      // At fp32 already, a step that fails whichever sample is left out is
      // the model's own: the stock fallback there is the LR cut alone, with
      // no precision to change. Below fp32 it would also take fp32, which the
      // fp32 re-run showed not to help.
      if (cause.rule == CauseRule::every_row && failed.amp == Amp::fp32) {
        choice.why = model_or_data_text(cause, e, failed);
        break;
      }
      [[fallthrough]];
    case CauseRule::trigger_rows:
      // Non-finite at full precision: fp32 would not help, and the search
      // that tells a sample from the model found the one or could not run;
      // neither escalates anything by itself (a recurrence does).
      choice.remedy = Remedy::skip_model_or_data;
      choice.why = model_or_data_text(cause, e, failed);
      break;
  }
  return choice;
}

}  // namespace

RemedyChoice choose_remedy(const FailedStep& failed, StepReruns& reruns) {
  if (failed.batch_finite && !failed.capture) {
    RemedyChoice choice;
    choice.why = "not investigated (probe off)";
    return choice;
  }
  if (failed.batch_finite && failed.capture->ops_seen < 0 && !failed.capture->compiled_only) {
    RemedyChoice choice;
    choice.why = "not diagnosed: the forensic re-run failed";
    return choice;
  }
  CauseEvidence e = first_evidence(failed);
  std::string fp32_error;
  const Cause cause = diagnosed_cause(failed, reruns, e, fp32_error);
  return remedy_for(cause, e, failed, reruns, fp32_error);
}

bool rerun_is_finite(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp, double loss_scale,
                     const StepSetup& setup, const MicroBatch& micro, const std::vector<std::string>& fp32_modules,
                     bool* switchable, std::string* error, double* derived_weight) {
  bool finite = false;
  if (derived_weight) *derived_weight = std::numeric_limits<double>::quiet_NaN();
  try {
    Fp32ModuleRegions regions(model, fp32_regions_apply(amp, fp32_modules) ? fp32_modules : std::vector<std::string>{});
    // The loss scale belongs to fp16; an fp32 re-run has none.
    const double scale = amp == Amp::fp16 ? loss_scale : 1.0;
    const StepRecomputation rerun =
        recompute_step(model, parameters, amp, scale, setup, std::vector<MicroBatch>{micro});
    if (derived_weight) *derived_weight = rerun.derived_weights.front();
    finite = rerun.finite();
    if (switchable && !regions.switchable()) *switchable = false;
  } catch (const std::exception& e) {
    // An op that raised on a non-finite value (binary_cross_entropy checks
    // its input), or a region whose inputs' dtype its ops reject.
    finite = false;
    if (error) *error = one_line_error(e);
  }
  clear_grads(parameters);
  return finite;
}

void fix_loss_weight(MicroBatch& micro, double derived) {
  if (!std::isfinite(micro.recorded_loss) || !std::isfinite(derived)) return;
  micro.loss_weight = derived;
  micro.recorded_loss = std::numeric_limits<double>::quiet_NaN();
}

LiveStepReruns::LiveStepReruns(TrainableModel& model, const std::vector<at::Tensor>& parameters, double loss_scale,
                               const StepSetup& setup, MicroBatch micro)
    : model_(model), parameters_(parameters), loss_scale_(loss_scale), setup_(setup), micro_(std::move(micro)) {}

bool LiveStepReruns::finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) {
  last_error_.clear();
  if (without_row < 0) {
    double derived = std::numeric_limits<double>::quiet_NaN();
    const bool finite = rerun_is_finite(model_, parameters_, amp, loss_scale_, setup_, micro_, fp32_modules,
                                        &switchable_, &last_error_, &derived);
    fix_loss_weight(micro_, derived);
    weight_read_ = true;
    // The re-run started the generator from the step's state: where it left
    // it says whether the step drew from it.
    if (!draws_ && micro_.cpu_rng_state.known()) draws_ = !micro_.cpu_rng_state.is_current();
    return finite;
  }
  if (!weight_read_ && std::isfinite(micro_.recorded_loss)) finite(amp, fp32_modules, -1);  // reads the weight first
  MicroBatch without = micro_;
  without.batch = micro_.batch.without_row(without_row);
  return rerun_is_finite(model_, parameters_, amp, loss_scale_, setup_, without, fp32_modules, &switchable_,
                         &last_error_);
}

bool LiveStepReruns::finite_with_row_replaced(Amp amp, const std::vector<std::string>& fp32_modules, int64_t row,
                                              int64_t by) {
  last_error_.clear();
  if (!weight_read_ && std::isfinite(micro_.recorded_loss)) finite(amp, fp32_modules, -1);  // reads the weight first
  MicroBatch replaced = micro_;
  replaced.batch = micro_.batch.with_row_replaced(row, by);
  return rerun_is_finite(model_, parameters_, amp, loss_scale_, setup_, replaced, fp32_modules, &switchable_,
                         &last_error_);
}

bool LiveStepReruns::draws_random_numbers() {
  if (!draws_known()) finite(Amp::fp32, {}, -1);
  return draws_.value_or(false);
}

std::string LiveStepReruns::ambiguous_rows() { return micro_.batch.ambiguous_rows(); }

std::vector<int64_t> LiveStepReruns::rows_out_of_range(const std::vector<int64_t>& rows) {
  return micro_.batch.rows_out_of_range(rows, kRowOutOfRangeFactor);
}

std::vector<std::string> LiveStepReruns::modules_seen() {
  probe::OpCapture capture;
  finite(Amp::fp32, {}, -1);
  return capture.modules_seen();
}

}  // namespace nanscope
