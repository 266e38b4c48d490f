#pragma once
// StepGuard's insides, behind its public header: what it steers, the step
// runner (both forms), the failed step's pipeline and the doom search, each
// implemented in its own step_guard_*.cpp; forensics (failed/forensics.hpp)
// and recovery (failed/recovery_actions.hpp) are objects of their own.
// Forensics and the doom search keep their state in their own objects
// (forensics_memory.hpp, doom_memory.hpp); Impl holds and wires them, and a
// failed step passes values from one stage to the next
// (failed_step_values.hpp). Private to core.
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "failed/failed_step_values.hpp"
#include "failed/forensics.hpp"
#include "failed/recovery_actions.hpp"
#include "guard/running_step.hpp"
#include "guard/steered.hpp"
#include "guard/watched_step.hpp"
#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/doom_memory.hpp"
#include "nanscope/core/forensics_memory.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/guard_errors.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/recovery.hpp"
#include "nanscope/core/recovery_words.hpp"
#include "nanscope/core/sentinel.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/probe.hpp"

namespace nanscope {

// The event of a step whose micro-batches with no target were left out
// (StepOutcome::adding_nothing; step_guard_empty_losses.cpp).
std::string micro_batches_left_out_text(const RunningStep& run);

// What undoing a skipped step put back: the buffers its forward had written,
// and the clause its skip event adds.
struct SkippedStepUndone {
  std::vector<std::string> restored;
  std::string text;
};

struct StepGuard::Impl {
  Impl(GuardedModel model, torch::optim::Optimizer* optimizer, GuardOptions options);

  // --- The step runner (step_guard_running.cpp: both forms' begin and end; step_guard_watched.cpp: the watched form).
  RunningStep begin_step(int64_t step, const StepContext& context);
  GuardedStep end_step(RunningStep& run, const std::vector<float>& act_absmax);
  GuardedStep step(int64_t step, const at::Tensor& inputs, const at::Tensor& targets, const StepContext& context);
  GuardedStep step(int64_t step, const LossClosure& loss, const Batch& batch, const StepContext& context);
  GuardedStep step(int64_t step, const BatchLoss& loss, const Batch& batch, const StepContext& context);
  GuardedStep run_closure_step(int64_t step, const Batch& batch, const StepContext& context);
  GuardedStep closure_step(int64_t step, const Batch& batch, const StepContext& context);
  ScopedAutocast autocast();
  void begin_micro_batch();
  void end_model_call();
  at::Tensor scale(const at::Tensor& loss, const Batch& micro_batch, const std::vector<Batch>& earlier_call_batches,
                   bool changed_since_call);
  at::Tensor unscale();
  at::Tensor flags_for_gradient_reduction();
  GuardedStep step(const StepContext& context);
  int64_t number_of(const StepContext& context) const { return context.step >= 0 ? context.step : next_step_; }
  void forget_calls_outside_steps();
  GuardedStep watched_step(const StepContext& context);
  void undo_loops_update();
  WatchedPhase watched_phase() const { return watched_ ? watched_->phase : WatchedPhase::closed; }
  // The watched step after `call`, opened if none is (or std::logic_error: a call out of order).
  WatchedStep& advance_watched(WatchedCall call);
  // body(), and with several ranks its exception stops the run first (stop_for_failed_rank).
  GuardedStep stopping_if_a_rank_fails(const GradientAverager* ranks, const std::function<GuardedStep()>& body);
  // Each micro-batch that came after several model calls gets the call its loss used.
  void decide_micro_batches(RunningStep& run);
  // Once, on the first step: a NANSCOPE_MODULE_SCOPE name the model has no module for is a warning.
  void check_scope_names(int64_t step, const std::vector<std::string>& opened);
  // Says, once, at the first step whose batch shows it, which tensor's rows
  // two dimensions could hold and how to declare them: a failed step's row
  // search cannot run until then (a shape read, no sync).
  void tell_ambiguous_rows(int64_t step, const Batch& batch);
  // Says, once, on the first watched step at 16 bits, when the loss's
  // matrix products ran in fp32: the loop's forward ran outside autocast.
  void tell_forward_outside_autocast(int64_t step, const at::Tensor& loss);
  // Throws std::invalid_argument naming planned fp32 modules the step did not run.
  void check_planned_fp32_modules(const std::vector<std::string>& missing);
  // GuardOptions::fp32_modules naming a module of 16-bit weights: std::invalid_argument.
  void refuse_16bit_fp32_modules() const;
  // The early warnings of a finite step, as recorded.
  std::vector<std::string> warn_if_heading_for_trouble(const RunningStep& run,
                                                       const std::vector<float>& layer_grad_norm,
                                                       const std::vector<float>& layer_act_absmax);
  SkippedStepUndone undo_skipped_step(const RunningStep& run);
  // The end of a step whose trouble lasted the rollback policy's patience: its recovery.
  RecoveryDone on_persisting_trouble(const RunningStep& run);

  // --- A failed step's pipeline (step_guard_failed.cpp): its facts, the
  // forensics' findings, the doom search's finding, the decision, the
  // recovery, returned together for end_step's GuardedStep.
  FailedStepConclusion on_nonfinite_step(RunningStep& run, const std::vector<float>& layer_grad_norm,
                                         const std::string& undone);
  // The failed step's last writes (false: the loss scaler's routine backoff); then it is read only.
  bool settle_failed_step(RunningStep& run);
  bool scalers_backoff(const StepOutcome& outcome, double loss_scale) const;
  bool nonfinite_without_the_scale(const RunningStep& run);
  // The micro-batches whose NaN loss is a mean over no target, with exactly
  // zero gradients (StepSettings::losses_adding_nothing; step_guard_empty_losses.cpp).
  std::vector<size_t> losses_adding_nothing(RunningStep& run, const StepOutcome& outcome);
  // These micro-batches run again as the step ran them (its precision, fp32
  // modules, setup, and the loop's loss function for a watched step).
  StepRecomputation rerun_as_the_step_ran(const RunningStep& run, const std::vector<MicroBatch>& micro_batches,
                                          double loss_scale, probe::OpCapture* capture = nullptr);
  // "non-finite loss at the optimizer's evaluation 2 of the step on rank(s) 1"
  std::string failure_text(const RunningStep& run) const;
  void say_scalers_backoff(const RunningStep& run, const std::string& undone);
  void record_skip(const RunningStep& run, const std::string& what, const std::string& undone);
  StepFacts step_facts(const RunningStep& run, const std::string& what, const ForensicFindings& found,
                       const DoomSearchResult& doom) const;
  // --fallback auto's diagnosis where the decision needs it (on every rank
  // of a sharded model, together), from the live state; nullopt where it
  // does not (a replay without the dooming update that survived needs none).
  std::optional<RemedyChoice> diagnosis_if_needed(const RunningStep& run, const ForensicFindings& found,
                                                  const StepFacts& facts, const RecoveryState& state);

  // --- What recovery (recovery_actions.hpp) leaves to the guard.
  void stop_for_failed_rank(int rank, const std::string& error);
  void refuse_if_stopped() const;
  double lr_multiplier() const { return recovery_.memory().lr_cut(); }
  Amp amp() const { return recovery_.memory().amp(); }
  const std::vector<std::string>& fp32_modules() const { return recovery_.memory().fp32_modules(); }
  const std::vector<probe::KernelRegion>& kernel_regions() const { return recovery_.memory().kernel_regions(); }
  GuardState state() const;
  void restore(const GuardState& state);
  std::unique_ptr<format::RunWriter> open_run_file();
  StateHealth health() const;

  // --- The doom search (step_guard_doom.cpp).
  // GuardOptions::doom_search: keeps what a replay of this step needs.
  void record_for_doom_search(const RunningStep& run);
  // Searches back for the update that doomed this failing step, and where the
  // run may go back, replays it without that update to the end (the replay
  // waits in DoomSearchResult::live for the decision).
  // `may_replay_without`: the run may go back and replay without a dooming
  // update (the decision's fact, replay_possible); a replay that survives
  // leaves the live state in `held`.
  DoomSearchResult search_dooming_step(const RunningStep& run, const ForensicFindings& found, bool may_replay_without,
                                       HeldLiveState& held);
  std::string doom_search_refused(const RunningStep& run, const ForensicFindings& found,
                                  const TrainingState* from) const;
  void replay_earlier_steps(const RunningStep& run, const TrainingState& from,
                            const std::vector<const StepRecord*>& records, bool may_replay_without,
                            DoomSearchResult& doom, HeldLiveState& held);
  void say_doom_search(int64_t step, const DoomSearchResult& doom, bool replayed);

  Steered steered_;                       // declared first: the members below are built from it
  std::unique_ptr<WatchedStep> watched_;  // the watched step in progress
  GuardOptions options_;
  std::vector<at::Tensor> parameters_;
  probe::Probe probe_;
  LossScaler scaler_;
  Journal journal_;  // run.h5 and the log: each decision's event and line from one call
  Sentinel sentinel_;
  // Each job's own state: forensics and the doom search; recovery carries
  // out a failed step's action and owns what that changes.
  ForensicsMemory forensics_memory_;
  DoomMemory doom_;
  RecoveryActions recovery_;
  Forensics forensics_;  // over the model, the probe, the journal and forensics_memory_
  BufferTransaction transaction_;
  bool fp32_modules_checked_ = false;  // the planned names were checked against a step that ran them
  bool scope_names_checked_ = false;
  bool ambiguous_rows_told_ = false;        // a batch tensor's rows two dimensions could hold was named once
  bool forward_precision_checked_ = false;  // tell_forward_outside_autocast ran
  int64_t ambiguous_rows_checked_at_ = -1;  // the batch size last read for it
  std::exception_ptr model_exception_;      // what the model threw in this step (ModelError::original)
  int64_t next_step_ = 0;
  // The ranks of the binding's process group (StepGuardHarness::set_ranks):
  // known before step() brings them, so the flags' reduction can begin before
  // it (in DDP's last bucket, or at the watched form's unscale()).
  GradientAverager* ranks_ = nullptr;
  bool restored_ = false;                                // restore() came: run.h5 goes on where it was (open_run_file)
  StepSetupHook step_setup_hook_;                        // set_step_setup()
  std::vector<at::Tensor> weights_before_loops_update_;  // undo_loops_update()
  KeptBatches kept_batches_;                             // what watched steps keep of their micro-batches for a re-run
};

}  // namespace nanscope
