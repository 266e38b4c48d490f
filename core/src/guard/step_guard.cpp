// StepGuard's front, and the tools' StepGuardHarness: each call handed to
// the guard's Impl (step_guard_impl.hpp).
#include "nanscope/core/step_guard.hpp"

#include "nanscope/core/step_guard_harness.hpp"

#include "guard/step_guard_impl.hpp"

namespace nanscope {

StepGuard::StepGuard(GuardedModel model, torch::optim::Optimizer& optimizer, GuardOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), &optimizer, std::move(options))) {}
StepGuard::StepGuard(GuardedModel model, GuardOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), nullptr, std::move(options))) {}
StepGuard::~StepGuard() = default;

GuardedStep StepGuard::closure_step(const LossClosure& loss, const Batch& batch, const StepContext& context) {
  impl_->forget_calls_outside_steps();  // before numbering: a forgotten call gives its number back
  return impl_->step(impl_->number_of(context), loss, batch, context);
}
GuardedStep StepGuard::closure_step(const BatchLoss& loss, const Batch& batch, const StepContext& context) {
  impl_->forget_calls_outside_steps();
  return impl_->step(impl_->number_of(context), loss, batch, context);
}
GuardedStep StepGuard::closure_step(const at::Tensor& inputs, const at::Tensor& targets, const StepContext& context) {
  impl_->forget_calls_outside_steps();
  return impl_->step(impl_->number_of(context), inputs, targets, context);
}

void StepGuard::set_loss_fn(BatchLoss loss) { impl_->steered_.loss_fn = std::move(loss); }
ScopedAutocast StepGuard::autocast() { return impl_->autocast(); }
void StepGuard::begin_micro_batch() { impl_->begin_micro_batch(); }
void StepGuard::backward(const at::Tensor& loss, const Batch& micro_batch) {
  impl_->scale(loss, micro_batch, {}, false).backward();
}
at::Tensor StepGuard::scale(const at::Tensor& loss, const Batch& micro_batch,
                            const std::vector<Batch>& earlier_call_batches, bool changed_since_call) {
  return impl_->scale(loss, micro_batch, earlier_call_batches, changed_since_call);
}
at::Tensor StepGuard::unscale() { return impl_->unscale(); }
GuardedStep StepGuard::step(const StepContext& context) { return impl_->step(context); }
void StepGuard::undo_loops_update() { impl_->undo_loops_update(); }

bool StepGuard::stopped() const { return !impl_->recovery_.stopped().empty(); }
Amp StepGuard::amp() const { return impl_->amp(); }
double StepGuard::lr_multiplier() const { return impl_->lr_multiplier(); }
int64_t StepGuard::applied_steps() const { return impl_->recovery_.memory().applied_steps(); }
const std::vector<std::string>& StepGuard::fp32_modules() const { return impl_->fp32_modules(); }
StateHealth StepGuard::health() const { return impl_->health(); }
int64_t StepGuard::rollbacks() const { return impl_->recovery_.memory().rollback().rollbacks(); }
int64_t StepGuard::fallback_step() const { return impl_->recovery_.memory().fallback().fired_step(); }
GuardState StepGuard::state() const { return impl_->state(); }
void StepGuard::restore(const GuardState& state) { impl_->restore(state); }
double StepGuard::loss_scale() const { return impl_->scaler_.scale(); }
bool StepGuard::scaling() const { return impl_->scaler_.enabled(); }
void StepGuard::flush() { impl_->journal_.flush(); }
const std::string& StepGuard::run_file() const { return impl_->journal_.path(); }
const std::vector<std::string>& StepGuard::snapshots() const { return impl_->forensics_memory_.snapshots(); }
void StepGuard::add_other_model(const OtherModel& other) {
  nanscope::add_other_model(impl_->steered_.model, other);
  register_tensor_owners(impl_->steered_.model);
}

void StepGuardHarness::end_model_call() { guard_.impl_->end_model_call(); }
bool StepGuardHarness::step_open() const { return guard_.impl_->watched_phase() != WatchedPhase::closed; }
void StepGuardHarness::refuse_if_stopped() const { guard_.impl_->refuse_if_stopped(); }
void StepGuardHarness::stop_for_failed_rank(int rank, const std::string& error) {
  guard_.impl_->stop_for_failed_rank(rank, error);
}
int64_t StepGuardHarness::next_step() const { return guard_.impl_->next_step_; }
void StepGuardHarness::number_steps_from(int64_t step) { guard_.impl_->next_step_ = step; }
void StepGuardHarness::record_event(int64_t step, format::EventKind kind, const std::string& text) {
  guard_.impl_->journal_.event(step, kind, text);
}
void StepGuardHarness::set_step_setup(StepSetupHook hook) { guard_.impl_->step_setup_hook_ = std::move(hook); }
void StepGuardHarness::set_ranks(GradientAverager* ranks) { guard_.impl_->ranks_ = ranks; }
at::Tensor StepGuardHarness::flags_for_gradient_reduction() { return guard_.impl_->flags_for_gradient_reduction(); }
const std::vector<int>& StepGuardHarness::first_nonfinite_ranks() const {
  return guard_.impl_->forensics_memory_.first_nonfinite_ranks();
}

}  // namespace nanscope
