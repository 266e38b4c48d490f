// The step runner: a step's begin and end phases, which both forms share, and
// the closure form (the guard runs forward, loss and backward).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "guard/journal_endings.hpp"
#include "guard/step_guard_impl.hpp"
#include "nanscope/common/error_text.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/generator_states.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/probe/activation_recorder.hpp"
#include "nanscope/probe/finiteness.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

namespace {

// The outcome of a step whose forward or backward raised: nothing finite came
// of it, so it is skipped like a non-finite loss (gradients dropped, the fp16
// scale backs off).
StepOutcome raised_step_outcome(LossScaler& scaler, const std::vector<at::Tensor>& parameters) {
  clear_grads(parameters);
  StepOutcome out;
  out.loss = std::numeric_limits<double>::quiet_NaN();
  out.grad_norm = std::numeric_limits<double>::quiet_NaN();
  out.loss_finite = out.local_loss_finite = false;
  out.skipped = true;
  out.nonfinite_ranks = {0};
  scaler.update(true);
  return out;
}

constexpr int64_t kInputHeadroomEvery = 4;

double current_lr(const torch::optim::Optimizer& optimizer) {
  return optimizer.param_groups().empty() ? 0.0 : optimizer.param_groups().front().options().get_lr();
}

// What a step's end gathers from its stages.
struct StepEnd {
  double seconds = 0;
  SkippedStepUndone undone;           // a skipped step's
  std::vector<std::string> warnings;  // a finite step's
  FailedStepConclusion failed;        // a failed step's
  RecoveryDone persisting;            // trouble that lasted the rollback policy's patience
};

// The step's GuardedStep, built once from what the step ran with and came
// to and what its end gathered: the step's last use, so its outcome (a norm
// per parameter among it) moves into the result instead of being copied.
GuardedStep guarded_step(RunningStep& run, StepEnd& end) {
  GuardedStep result;
  result.loss = at::scalar_tensor(run.outcome.loss, at::kDouble);
  result.outcome = std::move(run.outcome);
  result.amp = run.amp;
  result.lr = run.lr;
  result.loss_scale = run.loss_scale;
  result.seconds = end.seconds;
  result.error = std::move(run.error);
  result.restored = std::move(end.undone.restored);
  result.warnings = std::move(end.warnings);
  const FailedStepConclusion& failed = end.failed;
  result.first_birth = failed.found.first_birth;
  result.snapshot = failed.found.snapshot;
  result.doomed_by = failed.doom.doomed_by;
  result.doomed_by_step = failed.doom.doomed_by_step;
  result.doom_rows = failed.doom.rows;
  result.remedy = failed.done.remedy;
  result.listed_samples = failed.listed_samples;
  result.fell_back = failed.done.fell_back || end.persisting.fell_back;
  result.rolled_back_to =
      end.persisting.rolled_back_to >= 0 ? end.persisting.rolled_back_to : failed.done.rolled_back_to;
  return result;
}

}  // namespace

RunningStep StepGuard::Impl::begin_step(int64_t step, const StepContext& context) {
  end_if_interrupted();  // a Ctrl-C held since the last step: its rows are written, the program ends
  // The run file is settled before the step numbers move (open_run_file
  // goes on after the step before the first one this guard runs).
  journal_.writer();
  RunningStep run;
  run.step = step;
  run.context = context;
  run.start = std::chrono::steady_clock::now();
  model_exception_ = nullptr;
  run.amp = amp();
  // The LR of the update: the loop's (or the schedule's) times the guard's cuts.
  run.lr = (context.lr >= 0 ? context.lr : current_lr(steered_.optimizer)) * lr_multiplier();
  run.loss_scale = scaler_.scale();
  run.growth_tracker_before = scaler_.growth_tracker();
  if (step_setup_hook_) run.setup = step_setup_hook_(step);
  if (run.setup) run.setup(true);
  transaction_.begin(steered_.model);
  run.settings = StepSettings{};
  run.settings.amp = amp();
  run.settings.clip = options_.clip;
  run.settings.parameter_norms = options_.probe;
  run.settings.written_buffers = &transaction_.written_floating();
  run.settings.buckets = context.averager;
  run.settings.averaged_parameter_norms = options_.warn;
  run.settings.stop_requested = context.stop_requested;
  run.settings.skip_loss_above = recovery_.memory().rollback().skip_loss_above(step);
  next_step_ = step + 1;
  return run;
}

GuardedStep StepGuard::Impl::step(int64_t step, const at::Tensor& inputs, const at::Tensor& targets,
                                  const StepContext& context) {
  return run_closure_step(step, Batch(inputs, targets), context);
}

GuardedStep StepGuard::Impl::run_closure_step(int64_t step, const Batch& batch, const StepContext& context) {
  refuse_if_stopped();
  return stopping_if_a_rank_fails(context.averager, [&] { return closure_step(step, batch, context); });
}

GuardedStep StepGuard::Impl::stopping_if_a_rank_fails(const GradientAverager* ranks,
                                                      const std::function<GuardedStep()>& body) {
  if (!ranks) return body();
  try {
    return body();
  } catch (const DeadRunError&) {
    throw;  // the ranks agreed to stop: said already
  } catch (const std::exception& e) {
    // Its peers wait in a collective (the sharded forward's all-gathers, the
    // guard's own sum) that this rank will not join: they end with the
    // process group's error, at once or at its timeout, and stop here too.
    stop_for_failed_rank(ranks->rank(), one_line_error(e));
    throw;
  }
}

void StepGuard::Impl::stop_for_failed_rank(int rank, const std::string& error) {
  const int64_t step = watched_ ? watched_->run.step : next_step_ - 1;
  if (watched_ && watched_->run.setup) watched_->run.setup(false);
  watched_.reset();
  recovery_.stop(step, "failed on rank " + std::to_string(rank) + ": " + error +
                           "; a step of several ranks cannot go on without every rank: the run stops on each (the "
                           "others end with the process group's error, at once or at its timeout)");
}

void StepGuard::Impl::refuse_if_stopped() const {
  // A loop that misses the stop would otherwise pay a forensic re-run on
  // every later step of a run nothing can save.
  if (!recovery_.stopped().empty())
    throw DeadRunError("the guard stopped the run at " + recovery_.stopped() +
                       " (no further step: end the loop, or start again from a healthy checkpoint)");
}

void StepGuard::Impl::forget_calls_outside_steps() {
  if (watched_phase() == WatchedPhase::calls) {
    // A forward outside the closure (an evaluation with gradients on, a
    // loop's forward it never took a backward of) opened no step of the
    // loop's: forgotten, its number given back.
    next_step_ = watched_->run.step;
    watched_.reset();
  }
}

GuardedStep StepGuard::Impl::closure_step(int64_t step, const Batch& batch, const StepContext& context) {
  forget_calls_outside_steps();
  if (watched_phase() != WatchedPhase::closed)
    throw std::logic_error("StepGuard::step(closure, batch): a watched step is open (call step() first)");
  RunningStep run = begin_step(step, context);
  StepSettings& settings = run.settings;
  // Without the data set rows, they are unknown (a snapshot says -1), not guessed.
  if (options_.probe) probe_.begin_step(step, context.batch_rows);
  run.micro_batches = {MicroBatch{batch, probe_.cpu_rng_state(), 1.0}};
  tell_ambiguous_rows(step, batch);
  // The inputs' magnitude for the headroom warning: one reduction, read with
  // the rest, at every kInputHeadroomEvery-th step. It is a pass over the
  // whole batch (0.1 ms for a batch of 2.5 MB on one core), and the warning
  // follows a trend over tens of steps: the sentinel weighs each reading by
  // the steps since the one before.
  if (options_.warn && step % kInputHeadroomEvery == 0 && batch.inputs.defined() && batch.inputs.is_floating_point())
    settings.batch_absmax = probe::abs_max(batch.inputs);
  std::vector<float> act_absmax;
  try {
    std::optional<probe::OpCapture> live_capture;
    if (options_.capture_every_step) live_capture.emplace();
    std::optional<probe::ActivationRecorder> activations;
    if (options_.probe && options_.act_absmax_every > 0 && step % options_.act_absmax_every == 0)
      activations.emplace(probe_.layers().layer_names());
    // Last, so it is undone first: the capture and recorder restore module scopes as they found them.
    std::optional<Fp32ModuleRegions> fp32;
    if (fp32_regions_apply(amp(), fp32_modules())) fp32.emplace(steered_.model, fp32_modules());
    std::optional<probe::KernelRegions> kernels;  // the `kernel` remedy's pins, inside their modules
    if (!kernel_regions().empty()) kernels.emplace(kernel_regions());
    std::optional<probe::ScopeNameRecorder> scope_names;
    if (!scope_names_checked_ && !steered_.model.is_torchscript() && !steered_.model.scopes_named_by_hooks())
      scope_names.emplace();
    run.outcome = train_step(steered_.model, steered_.optimizer, scaler_, parameters_, settings, batch, lr_multiplier(),
                             &run.evaluations);
    if (scope_names) check_scope_names(step, scope_names->names());
    if (activations) act_absmax = activations->result();
    if (fp32 && !fp32_modules_checked_) run.fp32_not_entered = fp32->not_entered();
  } catch (const UpdateRaised& e) {
    // The optimizer's own error, after finite gradients: nothing to look for.
    if (run.setup) run.setup(false);
    journal_.flush();
    std::rethrow_exception(e.original);
  } catch (const std::exception& e) {
    // An op that raised on a NaN (binary_cross_entropy checks its input) is a
    // non-finite step if the forensic re-run finds a birth before it;
    // otherwise (or with no probe to look, or peers waiting in a collective)
    // it is an error in the model.
    if (run.setup) run.setup(false);
    if (!options_.probe || context.averager) throw;
    run.error = one_line_error(e);
    model_exception_ = std::current_exception();
    run.outcome = raised_step_outcome(scaler_, parameters_);
  }
  return end_step(run, act_absmax);
}

GuardedStep StepGuard::Impl::end_step(RunningStep& run, const std::vector<float>& act_absmax_in) {
  const int64_t step = run.step;
  const StepOutcome& outcome = run.outcome;
  if (run.setup) run.setup(false);
  if (run.fp32_not_entered) check_planned_fp32_modules(*run.fp32_not_entered);
  // A step that does not count leaves the model as it found it.
  StepEnd end;
  if (outcome.skipped) {
    end.undone = undo_skipped_step(run);
  } else {
    transaction_.commit();
    recovery_.applied(step);
  }
  end.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start).count();
  if (options_.doom_search.enabled) {
    decide_micro_batches(run);  // the search replays each step's micro-batches
    record_for_doom_search(run);
  }

  format::StepRow row;
  row.step = step;
  row.loss = outcome.loss;
  row.lr = run.lr;
  row.loss_scale = run.loss_scale;
  row.grad_norm = outcome.grad_norm;
  row.skipped = outcome.skipped;
  row.amp = run.amp;
  row.step_time = end.seconds;
  if (options_.probe) row.layer_grad_norm = probe_.layer_grad_norms(outcome.parameter_norms);
  row.layer_act_absmax = act_absmax_in;
  journal_.writer().append(row);
  if (outcome.skipped_as_spike) {
    journal_.record(step, format::EventKind::skip,
                    "loss " + number_text(outcome.global_loss) + " above " + number_text(run.settings.skip_loss_above) +
                        " (a spike, on probation after a rollback); optimizer step skipped" + end.undone.text);
    recovery_.observe(step, outcome.global_loss, false, true);
  } else if (outcome.finite()) {
    if (!outcome.adding_nothing.empty())
      journal_.record(step, format::EventKind::empty_loss, micro_batches_left_out_text(run));
    recovery_.finite_step();
    const bool trouble = recovery_.observe(step, outcome.global_loss, false, false);
    if (options_.warn) {
      // Several ranks: the averaged gradients' layer norms, the same on every rank.
      const std::vector<float> global_layers = outcome.global_parameter_norms.empty()
                                                   ? std::vector<float>{}
                                                   : probe_.layer_grad_norms(outcome.global_parameter_norms);
      end.warnings = warn_if_heading_for_trouble(run, global_layers.empty() ? row.layer_grad_norm : global_layers,
                                                 row.layer_act_absmax);
    }
    if (!trouble) recovery_.save_state_if_due(step, run.context.averager);
  } else {
    // Gradients that overflow at a finite loss are fp16's scaler's business.
    recovery_.observe(step, outcome.global_loss, !outcome.loss_finite || !scaler_.enabled(), false);
    end.failed = on_nonfinite_step(run, row.layer_grad_norm, end.undone.text);
  }
  if (recovery_.memory().rollback().trouble_persists() && end.failed.done.rolled_back_to < 0)
    end.persisting = on_persisting_trouble(run);
  model_exception_ = nullptr;  // explained by a birth: not kept (it may hold the caller's objects)
  end_if_interrupted();        // Ctrl-C during the step: its row is in, the program ends now
  return guarded_step(run, end);
}

RecoveryDone StepGuard::Impl::on_persisting_trouble(const RunningStep& run) {
  const StepOutcome& outcome = run.outcome;
  StepFacts trouble;
  trouble.trigger = RecoveryTrigger::persisting_trouble;
  trouble.what =
      outcome.skipped_as_spike
          ? "loss spikes through the probation after a rollback"
          : "trouble on " + std::to_string(recovery_.memory().rollback().options().patience) + " steps in a row";
  trouble.amp = amp();
  trouble.own_16bit = steered_.model.own_16bit_type_name();
  trouble.loss_finite = outcome.loss_finite;
  const RecoveryState state = recovery_.state_at(run.step);
  const RecoveryPlan plan = decide_recovery(trouble, state);
  return recovery_.apply(run, plan, recovery_words(plan, trouble, state));
}

GuardedStep StepGuard::Impl::step(int64_t step, const LossClosure& loss, const Batch& batch,
                                  const StepContext& context) {
  ClosureModel::Step closure(steered_.closure_model(), loss, batch);
  return run_closure_step(step, batch, context);
}

GuardedStep StepGuard::Impl::step(int64_t step, const BatchLoss& loss, const Batch& batch, const StepContext& context) {
  ClosureModel::Step closure(steered_.closure_model(), loss, batch);
  return run_closure_step(step, batch, context);
}

void StepGuard::Impl::tell_ambiguous_rows(int64_t step, const Batch& batch) {
  if (ambiguous_rows_told_ || !options_.probe) return;
  // A loop's batches keep their shapes but for an epoch's last: read again
  // only when the number of samples changes.
  const int64_t rows = batch.rows();
  if (rows == ambiguous_rows_checked_at_) return;
  ambiguous_rows_checked_at_ = rows;
  const std::string why = batch.ambiguous_rows();
  if (why.empty()) return;
  ambiguous_rows_told_ = true;
  journal_.say(step, why + "; until then a failed step's search for the sample without which it is finite cannot run");
}

void StepGuard::Impl::check_scope_names(int64_t step, const std::vector<std::string>& opened) {
  scope_names_checked_ = true;
  if (opened.empty()) return;
  const std::vector<std::string> modules = steered_.model.module_paths();
  for (const std::string& name : opened)
    if (std::find(modules.begin(), modules.end(), name) == modules.end())
      journal_.say(step, "NANSCOPE_MODULE_SCOPE(\"" + name +
                             "\") names no module of the model (named_modules() has no '" + name +
                             "'): births inside it will carry that name");
}

std::vector<std::string> StepGuard::Impl::warn_if_heading_for_trouble(const RunningStep& run,
                                                                      const std::vector<float>& layer_grad_norm,
                                                                      const std::vector<float>& layer_act_absmax) {
  StepSignals signals;
  signals.loss = run.outcome.global_loss;
  signals.grad_norm = run.outcome.grad_norm;
  signals.loss_scale = scaler_.enabled() ? run.loss_scale : 0.0;
  signals.precision_limit = format::largest_finite(run.amp);
  signals.layer_names = &probe_.layers().layer_names();
  signals.layer_grad_norm = &layer_grad_norm;
  signals.layer_act_absmax = &layer_act_absmax;
  signals.input_absmax = run.outcome.batch_absmax;
  std::vector<std::string> warnings;
  for (const Warning& w : sentinel_.observe(run.step, signals)) {
    recovery_.warned(run.step);
    warnings.push_back(journal_.record(run.step, format::EventKind::warning, w.text, "warning: "));
  }
  return warnings;
}

// The buffers the skipped step's forward wrote go back; says which, and which
// of them had gone non-finite, for the skip event.
SkippedStepUndone StepGuard::Impl::undo_skipped_step(const RunningStep& run) {
  std::string sick;
  if (!run.outcome.buffers_finite)
    for (const std::string& what : state_health(steered_.model, nullptr).nonfinite)
      if (what.rfind("buffer ", 0) == 0) sick += (sick.empty() ? "" : ", ") + what.substr(7);
  std::vector<std::string> missed;
  SkippedStepUndone undone;
  undone.restored = transaction_.roll_back(&missed);
  if (!sick.empty()) undone.text += "; the forward left buffer(s) non-finite: " + sick;
  if (!undone.restored.empty()) {
    StateHealth listed{undone.restored};
    undone.text += "; buffers restored: " + listed.text();
  }
  if (!missed.empty()) undone.text += "; written but not saved (first write seen now): " + StateHealth{missed}.text();
  return undone;
}

void StepGuard::Impl::refuse_16bit_fp32_modules() const {
  const std::vector<Module16Bit> held = modules_of_16bit_weights(steered_.model, options_.fp32_modules);
  if (held.empty()) return;
  const Module16Bit& first = held.front();
  const std::string widen = options_.origin == format::Origin::python
                                ? "model.get_submodule('" + first.module + "').float()"
                                : "->to(torch::kFloat32) on that module";
  throw std::invalid_argument(format::fp32_modules_setting(options_.origin, {first.module}) + ": module '" +
                              first.module + "' holds " + first.type + " weights (" + first.parameter +
                              "): autocast off inside it still computes in " + first.type +
                              ", and the float32 inputs an fp32 module takes would not match them; widen it first (" +
                              widen + ") to run it in fp32, or leave it out");
}

void StepGuard::Impl::check_planned_fp32_modules(const std::vector<std::string>& missing) {
  fp32_modules_checked_ = true;
  if (missing.empty()) return;
  journal_.flush();
  // Worded as the user set it: a flag, a GuardOptions field, a Python keyword.
  const char* where = steered_.model.is_torchscript()
                          ? "; a TorchScript model's modules must be run unoptimised, as nanscope "
                            "runs them"
                      : options_.origin == format::Origin::python
                          ? ""
                          : "; a native C++ module runs in fp32 alone inside its NANSCOPE_MODULE_SCOPE only";
  throw std::invalid_argument(format::fp32_modules_setting(options_.origin, missing) + ": no module " +
                              fp32_modules_flag_value(missing) +
                              " ran in the step (names are dotted paths as named_modules() gives them" + where + ")");
}

}  // namespace nanscope
