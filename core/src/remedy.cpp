#include "nanscope/core/remedy.hpp"

#include <chrono>
#include <limits>

#include "nanscope/common/error_text.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/fp32_modules.hpp"
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

bool is_data_category(format::Category c) {
  return c == format::Category::nonfinite_input || c == format::Category::all_targets_ignored;
}

// Rows without which the step is finite; empty when none, or all (then the
// batch's size, not a sample, is what matters). `unrun`: why the search says
// nothing, when every re-run without a row raised ("" when it ran).
std::vector<int64_t> rows_that_break(const FailedStep& failed, StepReruns& reruns, std::string& unrun) {
  std::vector<int64_t> found;
  if (failed.batch_size < 2 || failed.batch_size > kMaxRowsSearched) return found;
  if (reruns.draws_random_numbers()) {
    unrun =
        "the row search did not run: the step draws random numbers, so without a row every later draw shifts "
        "and a finite re-run would prove nothing";
    return found;
  }
  int64_t raised = 0;
  std::string error;
  for (int64_t row = 0; row < failed.batch_size; ++row) {
    if (reruns.finite(failed.amp, failed.fp32_modules, row)) found.push_back(row);
    if (reruns.raised()) {
      ++raised;
      if (error.empty()) error = reruns.last_error();
    }
  }
  if (int64_t(found.size()) == failed.batch_size) found.clear();
  if (found.empty() && raised == failed.batch_size)
    unrun = "the row search could not run: the loss raised on the batch without a row (" + error +
            "); name each tensor's row dimension (row_dims)";
  return found;
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

}  // namespace

RemedyChoice choose_remedy(const FailedStep& failed, StepReruns& reruns) {
  RemedyChoice choice;
  if (!failed.batch_finite) {
    choice.remedy = Remedy::skip_data;
    choice.why = "the batch holds a non-finite value";
    return choice;
  }
  if (!failed.capture) {
    choice.why = "not investigated (probe off)";
    return choice;
  }
  const auto& birth = failed.capture->first_birth;
  if (birth && is_data_category(probe::category_of(*birth))) {
    choice.remedy = Remedy::skip_data;
    choice.why = std::string("the birth is the data's (") + format::to_string(probe::category_of(*birth)) + ")";
    return choice;
  }
  if (failed.capture->compiled_only) {
    // Eager is finite: no precision or row of the model's math is at fault.
    choice.remedy = Remedy::skip_compiler;
    choice.why = format::capture_text(*failed.capture);
    return choice;
  }
  if (failed.capture->ops_seen < 0) {
    choice.why = "not diagnosed: the forensic re-run failed";
    return choice;
  }
  if (!birth && !failed.capture->reproduced) {
    choice.remedy = Remedy::skip_transient;
    choice.why = "the re-run of the same step was finite";
    return choice;
  }
  // A model of its own 16-bit weights computes in them with autocast off
  // too: that re-run is no fp32 one, and says nothing of precision (widening
  // a copy of the weights would double their memory mid-run; nanscope-replay does it).
  const bool fp32_rerun = failed.amp != Amp::fp32 && failed.own_16bit.empty();
  const bool fp32_finite = fp32_rerun && reruns.finite(Amp::fp32, {});
  if (fp32_rerun && reruns.raised()) {
    choice.remedy = Remedy::skip_undiagnosed;
    choice.why = "the re-run with autocast off raised (" + reruns.last_error() + "), so nothing says what to change";
    return choice;
  }
  if (fp32_finite) {
    // Non-finite again with no op seen making it (a compiled kernel): no
    // module to start a search from, so the whole model goes to fp32.
    if (!birth) {
      choice.why = "finite with autocast off; no birth was seen to search the modules from";
      return choice;
    }
    LiveFp32Trial trial(reruns, failed.amp, failed.fp32_modules);
    const std::vector<std::string> found = minimal_fp32_modules(trial, birth->op.module);
    if (found.empty()) {
      choice.why = "finite with autocast off, but no set of modules in fp32 is";
      return choice;
    }
    choice.remedy = Remedy::fp32_modules;
    choice.modules = found;
    choice.why = "finite with " + fp32_modules_flag_value(found) + " in fp32";
    std::tie(choice.seconds_before, choice.seconds_after) =
        rerun_seconds(reruns, failed.amp, failed.fp32_modules, trial.with_already(found));
    return choice;
  }
  std::string unrun;
  if (const std::vector<int64_t> rows = rows_that_break(failed, reruns, unrun); !rows.empty()) {
    choice.remedy = Remedy::skip_data;
    std::string list;
    for (int64_t r : rows) list += (list.empty() ? "" : ", ") + std::to_string(r);
    choice.why = "finite without batch row(s) " + list;
    return choice;
  }
  choice.why = !failed.own_16bit.empty()
                   ? "non-finite in the model's own " + failed.own_16bit +
                         " weights (no fp32 re-run: widen them to fp32 to try one, or replay the snapshot)"
               : failed.amp == Amp::fp32 ? "non-finite at fp32"
                                         : "non-finite with autocast off too";
  if (!unrun.empty()) {
    // Non-finite at full precision, a sample or the model: the search that
    // would tell them apart did not run, and that alone escalates nothing.
    choice.remedy = Remedy::skip_undiagnosed;
    choice.why += "; " + unrun;
  }
  return choice;
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

bool LiveStepReruns::draws_random_numbers() {
  if (!draws_known()) finite(Amp::fp32, {}, -1);
  return draws_.value_or(false);
}

std::vector<std::string> LiveStepReruns::modules_seen() {
  probe::OpCapture capture;
  finite(Amp::fp32, {}, -1);
  return capture.modules_seen();
}

}  // namespace nanscope
