#include "nanscope/core/step_guard.hpp"

#include "step_guard_running.hpp"

#include "nanscope/core/cpu_kernels.hpp"
#include "nanscope/core/generator_states.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <torch/optim/sgd.h>
#include "nanscope/common/error_text.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/compiled_region.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/probe/activation_recorder.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

namespace {

std::vector<std::string> trainable_names(const TrainableModel& model) {
  std::vector<std::string> out;
  for (const auto& [name, p] : model.trainable_parameters()) out.push_back(name);
  return out;
}

// Options checked before any member is built from them (a memory budget of
// inf would overflow a size_t), each refused one named as its author spells it.
GuardOptions checked(GuardOptions o) {
  check_guard_options(o, spelling_of(o.origin));
  return o;
}

probe::ProbeOptions probe_options(const GuardOptions& o) {
  probe::ProbeOptions p;
  p.run_dir = o.run_dir;
  p.rank = o.rank;
  p.world_size = o.world_size;
  return p;
}

LossScalerConfig scaler_config(Amp amp) {
  LossScalerConfig c;
  c.enabled = amp == Amp::fp16;
  return c;
}

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

// The line a guard starts with: where it writes, and what a failed step will
// trigger, so nobody learns the fallback's policy from its first firing.
std::string start_text(const GuardOptions& o, const std::string& run_file) {
  std::string fallback = std::string("fallback ") + fallback_mode_name(o.fallback) + " (";
  switch (o.fallback) {
    case FallbackMode::automatic:
      fallback +=
          "a non-finite step gets the remedy its diagnosis supports: a data fault or a transient is "
          "skipped, modules that need fp32 go to fp32, else the whole model";
      break;
    case FallbackMode::whole:
      fallback += o.amp == Amp::fp32 ? "the first non-finite step cuts the LR x " + number_text(o.lr_backoff)
                                     : "the first non-finite step switches the whole model to fp32 for the rest of "
                                       "the run, LR x " +
                                           number_text(o.lr_backoff);
      break;
    case FallbackMode::off:
    case FallbackMode::unknown: fallback += "a non-finite step is skipped, nothing more"; break;
  }
  return "nanscope: writing " + run_file + "; amp " + precision_name(o.amp) + ", " + fallback + "), clip " +
         (o.clip > 0 ? number_text(o.clip) : std::string("off")) + ", rollback " + (o.rollback.enabled ? "on" : "off") +
         ", warnings " + (o.warn ? "on" : "off");
}

double current_lr(const torch::optim::Optimizer& optimizer) {
  return optimizer.param_groups().empty() ? 0.0 : optimizer.param_groups().front().options().get_lr();
}

}  // namespace

namespace {

// The guard keeps a reference to the user's module: a shared_ptr that owns nothing.
std::unique_ptr<ClosureModel> closure_model_of(torch::nn::Module& module, const std::string& name) {
  return std::make_unique<ClosureModel>(ModuleModel::borrowing(name, module));
}

}  // namespace

StepGuard::StepGuard(torch::nn::Module& module, torch::optim::Optimizer& optimizer, GuardOptions options)
    : StepGuard(closure_model_of(module, options.model_name), optimizer, options) {
}  // a copy: argument order is unspecified

StepGuard::StepGuard(std::unique_ptr<TrainableModel> body, torch::optim::Optimizer& optimizer, GuardOptions options)
    : StepGuard(std::make_unique<ClosureModel>(std::move(body)), optimizer, std::move(options)) {}

StepGuard::WithoutOptimizer StepGuard::stand_in_for(std::unique_ptr<TrainableModel> body) {
  auto model = std::make_unique<ClosureModel>(std::move(body));
  // Holds the parameters for rollback states and checkpoints; never stepped.
  auto stand_in = std::make_unique<torch::optim::SGD>(trainable_tensors(*model), torch::optim::SGDOptions(0.0));
  return {std::move(model), std::move(stand_in)};
}

StepGuard::StepGuard(std::unique_ptr<TrainableModel> body, GuardOptions options)
    : StepGuard(stand_in_for(std::move(body)), std::move(options)) {}

StepGuard::StepGuard(WithoutOptimizer parts, GuardOptions options)
    : StepGuard(*parts.model, *parts.stand_in, std::move(options)) {
  owned_model_ = std::move(parts.model);
  no_optimizer_ = std::move(parts.stand_in);
  applies_update_ = false;
}

StepGuard::StepGuard(std::unique_ptr<ClosureModel> model, torch::optim::Optimizer& optimizer, GuardOptions options)
    : StepGuard(*model, optimizer, std::move(options)) {
  owned_model_ = std::move(model);
}

StepGuard::StepGuard(TrainableModel& model, torch::optim::Optimizer& optimizer, GuardOptions options)
    : model_(model),
      optimizer_(optimizer),
      options_(checked(std::move(options))),
      parameters_(trainable_tensors(model)),
      probe_(probe_options(options_), trainable_names(model)),
      scaler_(scaler_config(options_.amp)),
      fallback_(options_.fallback, options_.lr_backoff),
      snapshot_policy_(options_.max_snapshots),
      journal_(options_.log, options_.log_prefix, options_.model_name),
      amp_(options_.amp),
      sentinel_(options_.sentinel),
      rollback_(options_.rollback),
      ring_(options_.rollback.enabled || options_.doom_search.enabled
                ? size_t(std::max<int64_t>(0, options_.rollback.states))
                : 0,
            size_t(std::max(0.0, options_.rollback.memory_mb) * 1024 * 1024)),
      history_(size_t(std::max(0.0, options_.doom_search.memory_mb) * 1024 * 1024)),
      fp32_modules_(options_.fp32_modules),
      fp32_modules_checked_(options_.fp32_modules.empty()) {
  use_cpu_kernels_from_environment();
  if (options_.doom_search.enabled) rollback_.keep_states_for_search();
  // Births in a native model are named by the module whose tensors an op
  // reads where no module scope is open.
  register_tensor_owners(model_);
  std::filesystem::create_directories(options_.run_dir);
  format::RunHeader header;
  header.origin = options_.origin;
  if (options_.probe) header.layer_names = probe_.layers().layer_names();
  header.record_act_absmax = options_.act_absmax_every > 0;
  header.config = recorded_config(options_);
  const std::string path =
      (std::filesystem::path(options_.run_dir) / format::run_file_name(options_.rank, options_.world_size)).string();
  if (options_.resume_after_step >= 0) {
    journal_.open(format::RunWriter::resume(path, options_.resume_after_step));
    journal_.event(options_.resume_after_step, format::EventKind::resume, options_.resume_from);
    journal_.flush();
  } else {
    journal_.open(std::make_unique<format::RunWriter>(path, header));
  }
  if (options_.log) *options_.log << options_.log_prefix << start_text(options_, path) << "\n";
}

GuardState StepGuard::state() const {
  GuardState s;
  s.amp = amp_;
  s.fallback_step = fallback_.fired_step();
  s.rollback_lr_multiplier = rollback_lr_multiplier_;
  s.rollbacks = rollback_.rollbacks();
  s.scaling = scaler_.enabled();
  s.loss_scale = scaler_.scale();
  s.growth_tracker = scaler_.growth_tracker();
  s.last_applied_step = last_applied_step_;
  s.applied_steps = applied_steps_;
  s.fp32_modules = fp32_modules_;
  s.sentinel = sentinel_.state();
  return s;
}

void StepGuard::restore(const GuardState& s) {
  if (s.fallback_step >= 0 && !fallback_.fired())
    fallback_.fire(model_, optimizer_, scaler_, parameters_.front().device(), s.fallback_step);
  amp_ = s.amp;
  rollback_lr_multiplier_ = s.rollback_lr_multiplier;
  rollback_.restore_rollbacks(s.rollbacks);
  if (!s.scaling) scaler_.disable();
  scaler_.restore(s.loss_scale, s.growth_tracker);
  last_applied_step_ = s.last_applied_step;
  applied_steps_ = s.applied_steps;
  fp32_modules_ = s.fp32_modules;
  fp32_modules_checked_ = true;  // checked by the run that chose them
  if (!s.sentinel.empty()) sentinel_.restore(s.sentinel);
}

StateHealth StepGuard::health() const { return state_health(model_, &optimizer_); }

StepGuard::~StepGuard() = default;

const std::string& StepGuard::run_file() const { return journal_.writer().path(); }

StepGuard::Running StepGuard::begin_step(int64_t step, const StepContext& context) {
  Running run;
  run.step = step;
  run.context = context;
  run.start = std::chrono::steady_clock::now();
  model_exception_ = nullptr;
  run.result.amp = amp_;
  // The LR of the update: the loop's (or the schedule's) times the guard's cuts.
  run.result.lr = (context.lr >= 0 ? context.lr : current_lr(optimizer_)) * lr_multiplier();
  run.result.loss_scale = scaler_.scale();
  run.fault = model_fault_at(planted_, step);
  plant_fault(model_, run.fault);
  transaction_.begin(model_);
  run.settings = StepSettings{amp_, options_.clip, options_.probe, {}};
  run.settings.written_buffers = &transaction_.written_floating();
  run.settings.buckets = context.averager;
  run.settings.averaged_parameter_norms = options_.warn;
  run.settings.stop_requested = context.stop_requested;
  run.settings.skip_loss_above = rollback_.skip_loss_above(step);
  next_step_ = step + 1;
  return run;
}

GuardedStep StepGuard::step(int64_t step, const at::Tensor& inputs, const at::Tensor& targets,
                            const StepContext& context) {
  return run_closure_step(step, Batch(inputs, targets), context);
}

GuardedStep StepGuard::run_closure_step(int64_t step, const Batch& batch, const StepContext& context) {
  refuse_if_stopped();
  return stopping_if_a_rank_fails(context.averager, [&] { return closure_step(step, batch, context); });
}

GuardedStep StepGuard::stopping_if_a_rank_fails(const GradientAverager* ranks,
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

GuardedStep StepGuard::closure_step(int64_t step, const Batch& batch, const StepContext& context) {
  if (watched_ && watched_->run.micro_batches.empty()) {
    // A forward outside the closure (an evaluation with gradients on) opened
    // no step of the loop's: forgotten, its number given back.
    next_step_ = watched_->run.step;
    watched_.reset();
  }
  if (watched_) throw std::logic_error("StepGuard::step(closure, batch): a watched step is open (call step() first)");
  Running run = begin_step(step, context);
  StepSettings& settings = run.settings;
  if (options_.probe) {
    // Without the data set rows, they are unknown (-1), not guessed.
    probe_.begin_step(step,
                      context.batch_rows.defined() ? context.batch_rows : at::full({batch.rows()}, -1, at::kLong));
    settings.batch_nonfinite = probe_.batch_nonfinite(batch);
  }
  run.micro_batches = {MicroBatch{batch, probe_.cpu_rng_state(), 1.0}};
  // The inputs' magnitude for the headroom warning: one reduction, read with the rest.
  if (options_.warn && batch.inputs.defined() && batch.inputs.is_floating_point())
    settings.batch_absmax = batch.inputs.detach().abs().max();
  std::vector<float> act_absmax;
  try {
    std::optional<probe::OpCapture> live_capture;
    if (options_.capture_every_step) live_capture.emplace();
    std::optional<probe::ActivationRecorder> activations;
    if (options_.probe && options_.act_absmax_every > 0 && step % options_.act_absmax_every == 0)
      activations.emplace(probe_.layers().layer_names());
    // Last, so it is undone first: the capture and recorder restore module scopes as they found them.
    std::optional<Fp32ModuleRegions> fp32;
    if (fp32_regions_apply(amp_, fp32_modules_)) fp32.emplace(model_, fp32_modules_);
    std::optional<probe::ScopeNameRecorder> scope_names;
    if (!scope_names_checked_ && !model_.is_torchscript() && !model_.scopes_named_by_hooks()) scope_names.emplace();
    run.result.outcome = train_step(model_, optimizer_, scaler_, parameters_, settings, batch, lr_multiplier());
    if (scope_names) check_scope_names(step, scope_names->names());
    if (activations) act_absmax = activations->result();
    if (fp32 && !fp32_modules_checked_) run.fp32_not_entered = fp32->not_entered();
  } catch (const std::exception& e) {
    // An op that raised on a NaN (binary_cross_entropy checks its input) is a
    // non-finite step if the forensic re-run finds a birth before it;
    // otherwise (or with no probe to look, or peers waiting in a collective)
    // it is an error in the model.
    plant_fault(model_, {FaultKind::none});
    if (!options_.probe || context.averager) throw;
    run.result.error = one_line_error(e);
    model_exception_ = std::current_exception();
    run.result.outcome = raised_step_outcome(scaler_, parameters_);
  }
  return end_step(run, act_absmax);
}

GuardedStep StepGuard::end_step(Running& run, const std::vector<float>& act_absmax_in) {
  const int64_t step = run.step;
  GuardedStep& result = run.result;
  plant_fault(model_, {FaultKind::none});
  if (run.fp32_not_entered) check_planned_fp32_modules(*run.fp32_not_entered);
  // A step that does not count leaves the model as it found it.
  std::string undone;
  if (result.outcome.skipped) {
    undone = undo_skipped_step(result);
  } else {
    transaction_.commit();
    ++applied_steps_;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run.start).count();
  result.loss = at::scalar_tensor(result.outcome.loss, at::kDouble);
  if (options_.doom_search.enabled) {
    decide_micro_batches(run);  // the search replays each step's micro-batches
    record_for_doom_search(run);
  }

  format::StepRow row;
  row.step = step;
  row.loss = result.outcome.loss;
  row.lr = result.lr;
  row.loss_scale = result.loss_scale;
  row.grad_norm = result.outcome.grad_norm;
  row.skipped = result.outcome.skipped;
  row.amp = result.amp;
  row.step_time = result.seconds;
  if (options_.probe) row.layer_grad_norm = probe_.layer_grad_norms(result.outcome.parameter_norms);
  row.layer_act_absmax = act_absmax_in;
  journal_.writer().append(row);
  const StepOutcome& outcome = result.outcome;
  if (outcome.skipped_as_spike) {
    journal_.record(step, format::EventKind::skip,
                    "loss " + number_text(outcome.global_loss) + " above " + number_text(run.settings.skip_loss_above) +
                        " (a spike, on probation after a rollback); optimizer step skipped" + undone);
    rollback_.observe(step, outcome.global_loss, false, true);
  } else if (outcome.finite()) {
    if (!outcome.skipped) last_applied_step_ = step;
    nonfinite_in_a_row_ = 0;
    const bool trouble = rollback_.observe(step, outcome.global_loss, false, false);
    if (options_.warn) {
      // Several ranks: the averaged gradients' layer norms, the same on every rank.
      const std::vector<float> global_layers = outcome.global_parameter_norms.empty()
                                                   ? std::vector<float>{}
                                                   : probe_.layer_grad_norms(outcome.global_parameter_norms);
      warn_if_heading_for_trouble(step, result, global_layers.empty() ? row.layer_grad_norm : global_layers,
                                  row.layer_act_absmax);
    }
    if (!trouble) save_state_if_due(step, run.context.averager);
  } else {
    // Gradients that overflow at a finite loss are fp16's scaler's business.
    rollback_.observe(step, outcome.global_loss, !outcome.loss_finite || !scaler_.enabled(), false);
    on_nonfinite_step(run, row.layer_grad_norm, undone);
  }
  if (rollback_.trouble_persists() && result.rolled_back_to < 0) {
    StepFacts trouble;
    trouble.trigger = RecoveryTrigger::persisting_trouble;
    trouble.what = outcome.skipped_as_spike
                       ? "loss spikes through the probation after a rollback"
                       : "trouble on " + std::to_string(rollback_.options().patience) + " steps in a row";
    trouble.amp = amp_;
    trouble.loss_finite = outcome.loss_finite;
    apply_recovery(step, result, RecoveryTrigger::persisting_trouble,
                   decide_recovery(trouble, recovery_state(step), [] { return RemedyChoice{}; }));
  }
  model_exception_ = nullptr;  // explained by a birth: not kept (it may hold the caller's objects)
  return result;
}

ClosureModel& StepGuard::closure_model() {
  if (!owned_model_)
    throw std::logic_error(
        "StepGuard::step(closure, batch): this guard trains a TrainableModel; call step(step, inputs, targets), or "
        "build the guard from your module");
  return *owned_model_;
}

GuardedStep StepGuard::step(int64_t step, const LossClosure& loss, const Batch& batch, const StepContext& context) {
  ClosureModel::Step closure(closure_model(), loss, batch);
  return run_closure_step(step, batch, context);
}

GuardedStep StepGuard::step(int64_t step, const BatchLoss& loss, const Batch& batch, const StepContext& context) {
  ClosureModel::Step closure(closure_model(), loss, batch);
  return run_closure_step(step, batch, context);
}

// --- The watched form.

ScopedAutocast StepGuard::autocast() {
  begin_micro_batch();
  return ScopedAutocast(parameters_.front().device().type(), amp_);
}

void StepGuard::undo_loops_update() {
  if (weights_before_loops_update_.empty()) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].copy_(weights_before_loops_update_[i]);
  weights_before_loops_update_.clear();
}

void StepGuard::begin_micro_batch() {
  refuse_if_stopped();
  undo_loops_update();
  if (!watched_) {
    watched_ = std::make_unique<Watched>();
    watched_->run = begin_step(next_step_, {});
    watched_->run.watched = true;
    if (options_.probe) probe_.begin_step(watched_->run.step, at::full({0}, -1, at::kLong));
    // Planned fp32 modules run in fp32 inside the loop's forward too.
    if (fp32_regions_apply(amp_, fp32_modules_)) watched_->fp32.emplace(model_, fp32_modules_);
  }
  // get_state() copies ~5 KB: what lets a re-run draw the same dropout masks.
  if (options_.probe)
    watched_->calls.push_back(ModelCall{at::detail::getDefaultCPUGenerator().get_state(), next_autograd_node(),
                                        std::numeric_limits<uint64_t>::max(), std::nullopt});
}

void StepGuard::end_model_call() {
  if (watched_ && !watched_->calls.empty()) watched_->calls.back().end_node = next_autograd_node();
}

at::Tensor StepGuard::scale(const at::Tensor& loss, const Batch& micro_batch,
                            const std::vector<Batch>& earlier_call_batches, bool changed_since_call) {
  refuse_if_stopped();
  if (!watched_ || (options_.probe && watched_->calls.empty())) begin_micro_batch();
  Watched& w = *watched_;
  if (w.unscaled)
    throw std::logic_error(
        "StepGuard: a backward after unscale() in the same step (unscale once, after the last micro-batch)");
  // A re-run and the snapshot need the micro-batch as it was at its backward,
  // and loops refill their tensors in place before step() (DCGAN's
  // label.fill_, a reused target or staging buffer): kept as a copy, whenever
  // the step can be re-run (one device copy of each micro-batch; no host sync).
  const bool rerunnable = options_.probe && loss_fn_;
  std::vector<ModelCall> calls = std::exchange(w.calls, {});
  w.run.micro_batches.push_back(MicroBatch{rerunnable ? micro_batch.copied() : micro_batch,
                                           calls.empty() ? at::Tensor() : calls.back().cpu_rng_state, 1.0});
  w.run.micro_batches.back().changed_since_call = changed_since_call;
  if (rerunnable && calls.size() > 1) {
    // The latest call is the likely one; the loss's graph decides if the step fails.
    for (size_t i = 0; i + 1 < calls.size() && i < earlier_call_batches.size(); ++i)
      calls[i].batch = earlier_call_batches[i].copied();
    w.run.undecided.push_back(UndecidedMicroBatch{w.run.micro_batches.size() - 1, loss, std::move(calls)});
  }
  w.losses.push_back(loss.detach().reshape({}).to(at::kFloat));
  if (options_.probe) {
    const at::Tensor bad = probe_.batch_nonfinite(micro_batch);
    at::Tensor& flag = w.run.settings.batch_nonfinite;
    flag = flag.defined() ? at::maximum(flag, bad) : bad;
  }
  return scaler_.enabled() ? loss * scaler_.scale() : loss;
}

void StepGuard::backward(const at::Tensor& loss, const Batch& micro_batch) { scale(loss, micro_batch).backward(); }

void StepGuard::decide_micro_batches(Running& run) {
  for (const UndecidedMicroBatch& undecided : run.undecided) {
    const std::optional<size_t> used = call_the_loss_used(undecided);
    if (used) run.calls_outside_losses += undecided.calls.size() - 1;
    if (!used || *used + 1 == undecided.calls.size()) continue;  // the latest call, as kept
    const ModelCall& call = undecided.calls[*used];
    MicroBatch& micro = run.micro_batches.at(undecided.micro_batch);
    micro.cpu_rng_state = call.cpu_rng_state;
    if (call.batch && !call.batch->empty()) micro.batch = *call.batch;
  }
  run.undecided.clear();
}

void StepGuard::unscale() {
  if (!watched_) throw std::logic_error("StepGuard::unscale(): no backward since the last step()");
  if (!watched_->unscaled)
    watched_->unscaled =
        unscale_gradients(scaler_, parameters_, watched_->losses.empty() ? at::zeros({}) : watched_->losses.front());
}

GuardedStep StepGuard::step(const StepContext& context) {
  refuse_if_stopped();
  if (!watched_ || watched_->run.micro_batches.empty())
    throw std::logic_error(
        "StepGuard::step(): no backward through the guard since the last step (call "
        "guard.backward(loss, micro_batch) for each micro-batch first)");
  return stopping_if_a_rank_fails(context.averager, [&] { return watched_step(context); });
}

GuardedStep StepGuard::watched_step(const StepContext& context) {
  std::unique_ptr<Watched> w = std::move(watched_);
  Running& run = w->run;
  w->fp32.reset();
  // What the loop says at the end of the step (rows, LR, peers) joins what the begin phase knew.
  if (context.batch_rows.defined() && options_.probe) probe_.set_batch_rows(context.batch_rows);
  if (context.lr >= 0) run.result.lr = context.lr * lr_multiplier();
  run.context.batch_rows = context.batch_rows;
  run.context.averager = context.averager;
  run.settings.buckets = context.averager;
  const at::Tensor losses = at::stack(w->losses);
  if (w->losses.size() > 1) run.settings.micro_losses = losses;
  StepFinish finish;
  finish.optimizer = applies_update_ ? &optimizer_ : nullptr;
  finish.zero_grads_in_place = !applies_update_;
  finish.lr_multiplier = lr_multiplier();
  if (w->unscaled) finish.unscaled = &*w->unscaled;
  run.result.outcome = finish_step(scaler_, parameters_, run.settings, losses.sum(), finish);
  // A re-run weighs each micro-batch's loss as the loop did (nanoGPT divides by the accumulation steps).
  const std::vector<float>& recorded = run.result.outcome.micro_losses;
  for (size_t k = 0; k < run.micro_batches.size(); ++k)
    run.micro_batches[k].recorded_loss = k < recorded.size() ? recorded[k] : run.result.outcome.loss;
  // The loop applies its own update next: zero gradients make a skipped or
  // stopped step's update add nothing (and a loop that misses the stop does not crash on None).
  auto leave_nothing_to_apply = [&] {
    at::NoGradGuard no_grad;
    for (const at::Tensor& p : parameters_) {
      if (p.grad().defined())
        p.mutable_grad().zero_();
      else
        p.mutable_grad() = at::zeros_like(p);
    }
  };
  try {
    GuardedStep result = end_step(run, {});
    if (result.outcome.skipped && !applies_update_) {
      leave_nothing_to_apply();
      for (const at::Tensor& p : parameters_) weights_before_loops_update_.push_back(p.detach().clone());
    }
    return result;
  } catch (const DeadRunError&) {
    if (!applies_update_) leave_nothing_to_apply();
    throw;
  }
}

struct ScopedAutocast::State {
  compat::AutocastGuard guard;
};

ScopedAutocast::ScopedAutocast(at::DeviceType device, Amp amp)
    : state_(amp == Amp::fp32 ? nullptr : new State{compat::AutocastGuard(device, autocast_dtype(amp), true)}) {}
ScopedAutocast::~ScopedAutocast() = default;
ScopedAutocast::ScopedAutocast(ScopedAutocast&& other) noexcept = default;

void StepGuard::check_scope_names(int64_t step, const std::vector<std::string>& opened) {
  scope_names_checked_ = true;
  if (opened.empty()) return;
  const std::vector<std::string> modules = model_.module_paths();
  for (const std::string& name : opened)
    if (std::find(modules.begin(), modules.end(), name) == modules.end())
      journal_.say(step, "NANSCOPE_MODULE_SCOPE(\"" + name +
                             "\") names no module of the model (named_modules() has no '" + name +
                             "'): births inside it will carry that name");
}

void StepGuard::warn_if_heading_for_trouble(int64_t step, GuardedStep& result,
                                            const std::vector<float>& layer_grad_norm,
                                            const std::vector<float>& layer_act_absmax) {
  StepSignals signals;
  signals.loss = result.outcome.global_loss;
  signals.grad_norm = result.outcome.grad_norm;
  signals.loss_scale = scaler_.enabled() ? result.loss_scale : 0.0;
  signals.precision_limit = format::largest_finite(result.amp);
  signals.layer_names = &probe_.layers().layer_names();
  signals.layer_grad_norm = &layer_grad_norm;
  signals.layer_act_absmax = &layer_act_absmax;
  signals.input_absmax = result.outcome.batch_absmax;
  for (const Warning& w : sentinel_.observe(step, signals)) {
    rollback_.warned(step);
    result.warnings.push_back(journal_.record(step, format::EventKind::warning, w.text, "warning: "));
  }
}

// The buffers the skipped step's forward wrote go back; says which, and which
// of them had gone non-finite, for the skip event.
std::string StepGuard::undo_skipped_step(GuardedStep& result) {
  std::string sick;
  if (!result.outcome.buffers_finite)
    for (const std::string& what : state_health(model_, nullptr).nonfinite)
      if (what.rfind("buffer ", 0) == 0) sick += (sick.empty() ? "" : ", ") + what.substr(7);
  std::vector<std::string> missed;
  result.restored = transaction_.roll_back(&missed);
  std::string text;
  if (!sick.empty()) text += "; the forward left buffer(s) non-finite: " + sick;
  if (!result.restored.empty()) {
    StateHealth listed{result.restored};
    text += "; buffers restored: " + listed.text();
  }
  if (!missed.empty()) text += "; written but not saved (first write seen now): " + StateHealth{missed}.text();
  return text;
}

void StepGuard::check_planned_fp32_modules(const std::vector<std::string>& missing) {
  fp32_modules_checked_ = true;
  if (missing.empty()) return;
  journal_.flush();
  // Worded as the user set it: a flag, a GuardOptions field, a Python keyword.
  const char* where = model_.is_torchscript() ? "; a TorchScript model's modules must be run unoptimised, as nanscope "
                                                "runs them"
                      : options_.origin == format::Origin::python
                          ? ""
                          : "; a native C++ module runs in fp32 alone inside its NANSCOPE_MODULE_SCOPE only";
  throw std::invalid_argument(format::fp32_modules_setting(options_.origin, missing) + ": no module " +
                              fp32_modules_flag_value(missing) +
                              " ran in the step (names are dotted paths as named_modules() gives them" + where + ")");
}

void StepGuard::on_nonfinite_step(Running& run, const std::vector<float>& layer_grad_norm, const std::string& undone) {
  const int64_t step = run.step;
  GuardedStep& result = run.result;
  const StepContext& context = run.context;
  const StepOutcome& outcome = result.outcome;
  decide_micro_batches(run);
  // The re-runs below set the random generators to replay the step's draws;
  // the loop goes on from where its own step left them (a rollback excepted).
  KeepGeneratorStates loop_generators;
  const std::string what = !outcome.loss_finite     ? "non-finite loss"
                           : outcome.buffers_finite ? "non-finite gradients"
                                                    : "non-finite buffers";
  const std::string where = context.averager ? " on rank(s) " + format::rank_list_text(outcome.nonfinite_ranks) : "";
  journal_.event(step, format::EventKind::skip,
                 what + where + " at " + precision_name(result.amp) + "; optimizer step skipped" +
                     (result.error.empty() ? "" : " (the model raised: " + result.error + ")") + undone);
  if (context.averager) {
    // Every rank records who went non-finite; the first time, as the run's first.
    const std::string ranks = format::rank_list_text(outcome.nonfinite_ranks);
    if (first_nonfinite_ranks_.empty() && !outcome.nonfinite_ranks.empty()) {
      first_nonfinite_ranks_ = outcome.nonfinite_ranks;
      journal_.event(step, format::EventKind::first_nonfinite, ranks);
    }
    journal_.event(step, format::EventKind::nonfinite_ranks, ranks);
  }
  if (scaler_.enabled())
    journal_.event(step, format::EventKind::scale_backoff,
                   "loss scale " + number_text(result.loss_scale) + " -> " + number_text(scaler_.scale()));

  const std::optional<format::Capture> capture = investigate(run, layer_grad_norm);

  // The first failing step of a run of them: was it doomed by an earlier
  // update? With rollback on, a run replayed without that update goes on.
  // Several ranks all enter the search (it is collective) and agree there whether it runs.
  if ((!run.buffers_written_outside || context.averager) && options_.doom_search.enabled && nonfinite_in_a_row_ == 0 &&
      search_dooming_step(run, capture)) {
    journal_.flush();
    journal_.say(step, what + where + " -> skipped; the run goes on without the update that doomed it");
    return;
  }

  StepFacts facts;
  facts.trigger = RecoveryTrigger::nonfinite_step;
  facts.what = what + where;
  facts.amp = result.amp;
  facts.loss_finite = outcome.loss_finite;
  facts.several_ranks = context.averager != nullptr;
  facts.buffers_written_outside = run.buffers_written_outside;
  facts.rerunnable = rerunnable(run);
  if (!facts.buffers_written_outside) {
    const StateHealth health = this->health();
    // A sharded model's state is in shards: the ranks act on every shard's health alike.
    const bool sick_elsewhere =
        context.averager && context.averager->sharded() && !context.averager->every_rank(health.finite());
    if (!health.finite() || sick_elsewhere) {
      facts.state_finite = false;
      facts.broken_state =
          "the training state is non-finite (" + (health.finite() ? "on another rank's shard" : health.text()) +
          "; the last update that reached the weights: " +
          (last_applied_step_ >= 0 ? "step " + std::to_string(last_applied_step_) : std::string("none")) + ")";
    }
  }
  const std::string birth = capture && capture->first_birth ? birth_key(*capture) : std::string();
  if (auto seen = remedy_of_birth_.find(birth); !birth.empty() && seen != remedy_of_birth_.end()) {
    facts.same_birth_step = seen->second.first;
    facts.same_birth_as = seen->second.second;
  }
  const RecoveryPlan recovery = decide_recovery(facts, recovery_state(step), [&] { return diagnose(run, capture); });
  if (recovery.action == RecoveryAction::roll_back) loop_generators.keep_as_is();  // the saved state's, as its weights
  apply_recovery(step, result, RecoveryTrigger::nonfinite_step, recovery, birth);
}

}  // namespace nanscope
