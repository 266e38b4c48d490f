// The watched form: the loop runs forward, loss and backward (and its own
// clipping); the guard is told where micro-batches begin and end, keeps what
// a re-run needs, and decides the step at step().
#include "guard/forward_precision.hpp"
#include "guard/step_guard_impl.hpp"

#include <limits>
#include <stdexcept>
#include <utility>

#include "nanscope/common/torch_compat.hpp"

namespace nanscope {
namespace {

// The micro-batch's loss as one float, off the graph. Each view or cast
// skipped where the loss is one already: they are a dispatch each, every step.
// variable_data(), not detach(): the same values without autograd's view
// bookkeeping or a dispatch (the loss's value is all that is kept).
at::Tensor scalar_float(const at::Tensor& loss) {
  at::Tensor value = loss.variable_data();
  if (value.dim() != 0) value = value.reshape({});
  return value.scalar_type() == at::kFloat ? value : value.to(at::kFloat);
}

// The step's loss, as the verdict reads it: the micro-batches' losses summed.
at::Tensor step_loss(const std::vector<at::Tensor>& losses) {
  return losses.size() > 1 ? at::stack(losses).sum() : losses.front();
}

}  // namespace

ScopedAutocast StepGuard::Impl::autocast() {
  begin_micro_batch();
  return ScopedAutocast(parameters_.front().device().type(), amp());
}

void StepGuard::Impl::undo_loops_update() {
  if (weights_before_loops_update_.empty()) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].copy_(weights_before_loops_update_[i]);
  weights_before_loops_update_.clear();
}

WatchedPhase next_phase(WatchedPhase phase, WatchedCall call) {
  const bool loss_given = phase == WatchedPhase::losses || phase == WatchedPhase::unscaled;
  const char* const no_backward =
      " no backward through the guard since the last step (call guard.backward(loss, micro_batch), or scale(), for "
      "each micro-batch first)";
  switch (call) {
    case WatchedCall::model_call: return phase == WatchedPhase::closed ? WatchedPhase::calls : phase;
    case WatchedCall::loss:
      if (phase != WatchedPhase::unscaled) return WatchedPhase::losses;
      throw std::logic_error(
          "StepGuard: a backward after unscale() in the same step (unscale once, after the last micro-batch)");
    case WatchedCall::unscale:
      // As GradScaler's unscale_(): a second call would divide twice.
      if (phase == WatchedPhase::unscaled)
        throw std::logic_error(
            "StepGuard::unscale(): already called in this step (once per step, after the last "
            "micro-batch's backward and before the clipping)");
      if (loss_given) return WatchedPhase::unscaled;
      throw std::logic_error(std::string("StepGuard::unscale():") + no_backward);
    case WatchedCall::step:
      if (loss_given) return WatchedPhase::closed;
      throw std::logic_error(std::string("StepGuard::step():") + no_backward);
  }
  throw std::logic_error("StepGuard: unknown call of the watched step");
}

WatchedStep& StepGuard::Impl::advance_watched(WatchedCall call) {
  refuse_if_stopped();  // a stopped run takes no call of the watched step
  if (call == WatchedCall::loss && steered_.applies_update && steered_.update_evaluates_closure)
    throw std::logic_error(
        "the optimizer evaluates the loss itself (L-BFGS), several times a step: its steps run in the closure "
        "form, which gives it the closure (C++: guard.closure_step(loss_closure, batch); Python: "
        "guard.closure_step(closure, "
        "batch)), not in the watched form");
  const WatchedPhase next = next_phase(watched_phase(), call);
  if (!watched_) {
    undo_loops_update();
    watched_ = std::make_unique<WatchedStep>();
    watched_->run = begin_step(next_step_, {});
    watched_->run.watched = true;
    if (options_.probe) probe_.begin_step(watched_->run.step, {});  // the rows come with step(), if at all
    // Planned fp32 modules run in fp32 inside the loop's forward too.
    if (fp32_regions_apply(amp(), fp32_modules())) watched_->fp32.emplace(steered_.model, fp32_modules());
    if (!kernel_regions().empty()) watched_->kernels.emplace(kernel_regions());
  }
  watched_->phase = next;
  return *watched_;
}

void StepGuard::Impl::begin_micro_batch() {
  const bool step_begins = !watched_;
  WatchedStep& w = advance_watched(WatchedCall::model_call);
  if (!options_.probe) return;
  // What lets a re-run draw the same dropout masks. The step's first call
  // draws from where the probe's step began (taken just now, nothing drawn
  // since): that state serves, and allocates nothing (cpu_rng_state.hpp).
  CpuRngState rng_state = step_begins ? probe_.cpu_rng_state() : CpuRngState::now();
  w.calls.push_back(
      ModelCall{std::move(rng_state), next_autograd_node(), std::numeric_limits<uint64_t>::max(), std::nullopt});
}

void StepGuard::Impl::end_model_call() {
  if (watched_ && !watched_->calls.empty()) watched_->calls.back().end_node = next_autograd_node();
}

at::Tensor StepGuard::Impl::scale(const at::Tensor& loss, const Batch& micro_batch,
                                  const std::vector<Batch>& earlier_call_batches, bool changed_since_call) {
  WatchedStep& w = advance_watched(WatchedCall::loss);
  if (options_.probe && w.calls.empty()) begin_micro_batch();  // no call seen: the micro-batch's begins here
  // A re-run and the snapshot need the micro-batch as it was at its backward,
  // whenever the step can be re-run (kept_batches.hpp: the loop's own
  // tensors, or a copy where the loop writes into them before step()).
  const bool rerunnable = options_.probe && steered_.loss_fn;
  std::vector<ModelCall> calls = std::exchange(w.calls, {});
  const size_t k = w.run.micro_batches.size();
  auto keep = [&](const Batch& batch) { return kept_batches_.keep(batch, k, w.loops_tensors, w.copies); };
  w.run.micro_batches.push_back(MicroBatch{rerunnable ? keep(micro_batch) : micro_batch,
                                           calls.empty() ? CpuRngState() : calls.back().cpu_rng_state, 1.0});
  if (changed_since_call) w.run.micro_batches.back().written = InPlaceWrite::since_call;
  if (rerunnable) tell_ambiguous_rows(w.run.step, micro_batch);
  if (rerunnable && calls.size() > 1) {
    // The latest call is the likely one; the loss's graph decides if the step fails.
    for (size_t i = 0; i + 1 < calls.size() && i < earlier_call_batches.size(); ++i)
      calls[i].batch = keep(earlier_call_batches[i]);
    w.run.undecided.push_back(UndecidedMicroBatch{w.run.micro_batches.size() - 1, loss, std::move(calls)});
  }
  if (!forward_precision_checked_ && amp() != Amp::fp32) tell_forward_outside_autocast(w.run.step, loss);
  w.losses.push_back(scalar_float(loss));
  return scaler_.enabled() ? loss * scaler_.scale() : loss;
}

void StepGuard::Impl::tell_forward_outside_autocast(int64_t step, const at::Tensor& loss) {
  forward_precision_checked_ = true;
  if (product_precision(loss) != ProductPrecision::float32) return;
  const std::string precision = format::to_string(amp());
  const char* under = options_.origin == format::Origin::python
                          ? "`with guard.autocast():` around the forward and the loss"
                          : "`auto autocast = guard.autocast();` before the forward";
  journal_.say(step,
               "the loss's matrix products ran in fp32: the loop's forward ran outside autocast, while the "
               "guard runs " +
                   precision + " (its re-runs and snapshots run at " + precision + ", run.h5 says " + precision +
                   ", and a fallback to fp32 changes nothing). Run the forward "
                   "under the guard's autocast (" +
                   under + "), or give the guard amp fp32");
}

void StepGuard::Impl::decide_micro_batches(RunningStep& run) {
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

at::Tensor StepGuard::Impl::unscale() {
  WatchedStep& w = advance_watched(WatchedCall::unscale);
  w.unscaled = unscale_gradients(scaler_, parameters_, w.losses.front(), GradNormUse::as_a_value);
  // Several ranks, where the flags did not ride in DDP's last bucket: their
  // reduction (a sharded model's with its shards' norms) starts now, beside
  // the loop's clipping, and step() finds it done.
  if (ranks_ && !w.run.settings.begun_flags) {
    w.run.settings.buckets = ranks_;
    begin_reducing_flags(w.run.settings, step_loss(w.losses), parameters_, *w.unscaled);
  }
  return w.unscaled->total_norm;
}

at::Tensor StepGuard::Impl::flags_for_gradient_reduction() {
  // Called from the backward (DDP's last bucket): no call of the loop is
  // taken, so the watched step's phase stays as it is. Nothing before the
  // loop's loss came (the loop's own backward outside a step).
  if (!watched_ || watched_->losses.empty() || !ranks_) return {};
  RunningStep& run = watched_->run;
  run.settings.buckets = ranks_;
  return prepare_rank_flags(run.settings, step_loss(watched_->losses));
}

GuardedStep StepGuard::Impl::step(const StepContext& context) {
  advance_watched(WatchedCall::step);
  return stopping_if_a_rank_fails(context.averager, [&] { return watched_step(context); });
}

GuardedStep StepGuard::Impl::watched_step(const StepContext& context) {
  std::unique_ptr<WatchedStep> w = std::move(watched_);
  RunningStep& run = w->run;
  w->fp32.reset();
  // What the loop says at the end of the step (rows, LR, peers) joins what the begin phase knew.
  if (context.batch_rows.defined() && options_.probe) probe_.set_batch_rows(context.batch_rows);
  if (context.lr >= 0) run.lr = context.lr * lr_multiplier();
  run.context.batch_rows = context.batch_rows;
  run.context.averager = context.averager;
  run.settings.buckets = context.averager;
  const bool several = w->losses.size() > 1;
  if (several) run.settings.micro_losses = at::stack(w->losses);
  StepFinish finish;
  finish.optimizer = steered_.applies_update ? &steered_.optimizer : nullptr;
  finish.zero_grads_in_place = !steered_.applies_update;
  finish.lr_multiplier = lr_multiplier();
  if (w->unscaled) finish.unscaled = &*w->unscaled;
  // A micro-batch the loop wrote into after its backward is known before the
  // update (a micro-batch with no target is re-run as it was, or not at all).
  for (size_t k : kept_batches_.written_since_backward(w->loops_tensors))
    if (run.micro_batches[k].written == InPlaceWrite::none) run.micro_batches[k].written = InPlaceWrite::since_backward;
  w->loops_tensors.clear();
  run.settings.losses_adding_nothing = [this, &run](const StepOutcome& outcome) {
    return losses_adding_nothing(run, outcome);
  };
  // The step's loss as step_loss() has it, from the stack made above.
  const at::Tensor loss = several ? run.settings.micro_losses.sum() : w->losses.front();
  run.outcome = finish_step(scaler_, parameters_, run.settings, loss, finish);
  // A re-run weighs each micro-batch's loss as the loop did (nanoGPT divides by the accumulation steps).
  const std::vector<float>& recorded = run.outcome.micro_losses;
  for (size_t k = 0; k < run.micro_batches.size(); ++k)
    run.micro_batches[k].recorded_loss = k < recorded.size() ? recorded[k] : run.outcome.loss;
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
  kept_batches_.spare(std::move(w->copies));  // written again by the next step, once this one lets go of them
  try {
    GuardedStep result = end_step(run, {});
    if (result.outcome.skipped && !steered_.applies_update) {
      leave_nothing_to_apply();
      for (const at::Tensor& p : parameters_) weights_before_loops_update_.push_back(p.detach().clone());
    }
    return result;
  } catch (const DeadRunError&) {
    if (!steered_.applies_update) leave_nothing_to_apply();
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

}  // namespace nanscope
