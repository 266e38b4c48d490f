#pragma once
// What recovery (RecoveryActions, core/src/failed/recovery_actions.hpp) keeps between steps and alone
// changes: the precision and the modules in fp32, the fp32 fallback and
// whether it fired, the rollback policy and the states saved for it, the LR
// cut in force, the steps whose update reached the weights, and the run of
// non-finite steps the stop rule counts. The step runner reports each step to
// it; only RecoveryActions::apply's actions (and a restored checkpoint) change the
// cut, the precision, the modules and the saved states, or take back an
// applied step.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/fallback.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/guard_state.hpp"
#include "nanscope/core/kernel_switch.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/probe/module_scope.hpp"

namespace nanscope {

class RecoveryMemory {
 public:
  explicit RecoveryMemory(const GuardOptions& options)
      : fallback_(options.fallback),
        rollback_(options.rollback),
        // The doom search replays from the saved states, rollback on or off.
        ring_(options.rollback.enabled || options.doom_search.enabled
                  ? size_t(std::max<int64_t>(0, options.rollback.states))
                  : 0,
              size_t(std::max(0.0, options.rollback.memory_mb) * 1024 * 1024)),
        lr_backoff_(options.lr_backoff),
        amp_(options.amp),
        fp32_modules_(options.fp32_modules) {
    if (options.doom_search.enabled) rollback_.keep_states_for_search();
  }

  const FallbackPolicy& fallback() const { return fallback_; }
  const RollbackPolicy& rollback() const { return rollback_; }
  const StateRing& saved_states() const { return ring_; }
  double lr_cut() const { return lr_cut_; }  // lr_backoff for the fallback and each rollback
  int64_t nonfinite_in_a_row() const { return nonfinite_in_a_row_; }
  int64_t nonfinite_since() const { return nonfinite_since_; }  // the first of them
  Amp amp() const { return amp_; }                              // the precision steps run in now
  const std::vector<std::string>& fp32_modules() const { return fp32_modules_; }
  int64_t applied_steps() const { return applied_steps_; }
  int64_t last_applied_step() const { return last_applied_step_; }  // the last step whose update reached the weights

  // --- Each step, as the step runner saw it.
  // Its loss for the rollback policy; true for a step that was trouble.
  bool observe(int64_t step, double loss, bool nonfinite, bool skipped_as_spike) {
    return rollback_.observe(step, loss, nonfinite, skipped_as_spike);
  }
  void finite_step() { nonfinite_in_a_row_ = 0; }
  // The failed step observed last is no trouble after all (RecoveryPlan::counted).
  void explained() { rollback_.explained(); }
  // The step's update reached the weights.
  void applied(int64_t step) {
    ++applied_steps_;
    last_applied_step_ = step;
  }
  void warned(int64_t step) { rollback_.warned(step); }
  // The state after the healthy `step`; false when it is not kept (the budget).
  bool save(int64_t step, const TrainableModel& model, const torch::optim::Optimizer& optimizer,
            const LossScaler& scaler) {
    return ring_.save(step, model, optimizer, scaler);
  }
  void forget_saved_from(int64_t step) { ring_.forget_from(step); }
  void stop_saving() { ring_ = StateRing(0, 0); }  // one state is over the budget

  // --- RecoveryActions::apply's actions.
  // The whole-model fp32 fallback, with its LR cut. Returns whether the
  // model now runs in fp32 (FallbackPolicy::fire).
  bool fall_back(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler, at::Device device,
                 int64_t step) {
    lr_cut_ *= lr_backoff_;
    const bool in_fp32 = fallback_.fire(model, optimizer, scaler, device, step);
    if (in_fp32) amp_ = Amp::fp32;
    return in_fp32;
  }
  // --fallback auto's remedy: these modules run in fp32 from now on.
  void add_fp32_modules(const std::vector<std::string>& modules) {
    fp32_modules_.insert(fp32_modules_.end(), modules.begin(), modules.end());
  }
  // --fallback auto's `kernel` remedy: `kernel` is its family's from now on,
  // in `module` for attention's ("attn=math"); process-wide for oneDNN,
  // whose backward kernels run outside the module, or a module no scope
  // opens (the root, "", or any of a TorchScript model's: the diagnosis
  // names none there), spelt as the kernel alone ("native").
  void pin_kernel(const std::string& module, format::Kernel kernel) {
    if (pinned_in_module(kernel, module)) {
      kernel_regions_.push_back({module, kernel});
      pinned_kernels_.push_back(module + "=" + format::to_string(kernel));
    } else {
      nanscope::pin_kernel(kernel);
      pinned_kernels_.push_back(format::to_string(kernel));
    }
  }
  const std::vector<std::string>& pinned_kernels() const { return pinned_kernels_; }
  // The pins held inside their modules (probe::KernelRegions), each step.
  const std::vector<probe::KernelRegion>& kernel_regions() const { return kernel_regions_; }
  // The newest good state before the trouble began; nullptr if none.
  const TrainingState* rollback_target() const { return ring_.newest_before(rollback_.trouble_began()); }
  // At `step` the run went back to the state after step `to`, with an LR cut.
  void rolled_back(int64_t to, int64_t step) {
    lr_cut_ *= lr_backoff_;
    ring_.forget_from(to + 1);
    rollback_.rolled_back(step);
    nonfinite_in_a_row_ = 0;
    last_applied_step_ = to;
  }
  // At `step` the run was replayed without the update of `dooming_step`
  // (its whole update, or some of its rows): no LR cut (the cause is known
  // and gone), and it counts as a rollback.
  void replayed_without(int64_t dooming_step, int64_t step, bool whole_update) {
    ring_.forget_from(dooming_step);
    rollback_.rolled_back(step);
    if (whole_update) --applied_steps_;
    last_applied_step_ = step - 1;
  }
  // A non-rollback answer to persisting trouble: the policy starts counting again.
  void escalated() { rollback_.escalated(); }
  // A failed step the stop rule (GuardOptions::max_nonfinite_run) counts.
  void count_nonfinite(int64_t step) {
    if (nonfinite_in_a_row_++ == 0) nonfinite_since_ = step;
  }

  // --- Checkpoints: recovery's fields of GuardState.
  void write_to(GuardState& s) const {
    s.fallback_step = fallback_.fired_step();
    s.lr_multiplier = lr_cut_;
    s.rollbacks = rollback_.rollbacks();
    s.amp = amp_;
    s.fp32_modules = fp32_modules_;
    s.pinned_kernels = pinned_kernels_;
    s.last_applied_step = last_applied_step_;
    s.applied_steps = applied_steps_;
  }
  // The fallback fires again on the model as it had (fp32 weights, scaler off).
  void restore(const GuardState& s, TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
               at::Device device) {
    if (s.fallback_step >= 0 && !fallback_.fired()) fallback_.fire(model, optimizer, scaler, device, s.fallback_step);
    // A state from before format 1.7 kept the rollbacks' cut alone.
    lr_cut_ = s.lr_multiplier * (s.lr_multiplier_lacks_fallback && s.fallback_step >= 0 ? lr_backoff_ : 1.0);
    rollback_.restore_rollbacks(s.rollbacks);
    amp_ = s.amp;
    fp32_modules_ = s.fp32_modules;
    // The pins again, in the order they were made (a later one of the same family wins).
    pinned_kernels_.clear();
    kernel_regions_.clear();
    for (const std::string& pin : s.pinned_kernels) {
      const size_t eq = pin.rfind('=');
      const std::string module = eq == std::string::npos ? "" : pin.substr(0, eq);
      if (const std::optional<format::Kernel> kernel =
              format::from_string<format::Kernel>(eq == std::string::npos ? pin : pin.substr(eq + 1)))
        pin_kernel(module, *kernel);
    }
    last_applied_step_ = s.last_applied_step;
    applied_steps_ = s.applied_steps;
  }

 private:
  FallbackPolicy fallback_;
  RollbackPolicy rollback_;
  StateRing ring_;
  double lr_backoff_;
  double lr_cut_ = 1;
  int64_t nonfinite_in_a_row_ = 0;  // failed steps since the last finite one (or rollback)
  int64_t nonfinite_since_ = -1;
  Amp amp_;
  std::vector<std::string> fp32_modules_;
  std::vector<std::string> pinned_kernels_;
  std::vector<probe::KernelRegion> kernel_regions_;
  int64_t applied_steps_ = 0;
  int64_t last_applied_step_ = -1;
};

}  // namespace nanscope
