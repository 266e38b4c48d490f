#pragma once
// The stock mixed-precision loop around a training loop of your own:
//
//   Net net;                                        // any torch::nn::Module
//   torch::optim::SGD optimizer(net.parameters(), 0.01);
//   nanscope::StepGuard guard(net, optimizer, {"my-run", nanscope::Amp::bf16});
//   for (auto& batch : *loader) {
//     auto r = guard.step([&] { return torch::nll_loss(net.forward(batch.data), batch.target); }, batch);
//     if (!r.counted()) std::cout << r.first_birth << "\n";
//   }
//
// The closure is your forward and loss, as your loop wrote them; the guard
// does the rest of the step (zero_grad, backward, optimizer.step()). The
// trainer and replay use the other form: a TrainableModel whose loss(inputs,
// targets) is the forward, and guard.step(step, inputs, targets).
//
// The watched form leaves the whole step to your loop, as GradScaler does:
//
//   nanscope::StepGuard guard(net, optimizer, {"my-run", nanscope::Amp::bf16});
//   guard.set_loss_fn(loss_of);                      // loss_of(micro_batch): for the forensic re-run
//   for (...) {
//     for (auto& micro : micro_batches) {            // gradient accumulation: one graph alive at a time
//       auto autocast = guard.autocast();            // the guard's precision (fp32 after a fallback)
//       guard.backward(loss_of(micro) / accumulation, micro);
//     }
//     nanscope::GuardedStep r = guard.step();        // the verdict; optimizer.step() or a skip
//   }
//
// Each step: forward and loss under autocast, backward on the scaled loss
// (fp16), unscale, one host read for the verdict, clip, and the optimizer step
// or a skip. A skip is a transaction: weights, optimizer state and every
// buffer the forward wrote (BatchNorm's statistics) are as before the step. On
// a non-finite step the probe re-runs it under op-level capture to name the
// first birth, writes a snapshot nanscope-replay can rebuild (one per distinct
// birth), and the fallback acts: the stock one-shot switch to fp32 with the LR
// multiplied by lr_backoff (FallbackMode::whole), or the remedy the step's
// diagnosis supports (FallbackMode::automatic, remedy.hpp).
// Every step is a row of RUN_DIR/run.h5 (docs/format.md), every skip, birth,
// snapshot and fallback an event. nanscope-train's loop is this guard.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/closure_model.hpp"
#include "nanscope/core/doom_search.hpp"
#include "nanscope/core/fallback.hpp"
#include "nanscope/core/fault.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/guard_errors.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/guard_state.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/module_model.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/recovery.hpp"
#include "nanscope/core/remedy.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/sentinel.hpp"
#include "nanscope/core/snapshot_policy.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_history.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/probe.hpp"

namespace nanscope {

class ScopedAutocast;

// What a step brings besides its batch; the defaults suit one process.
struct StepContext {
  at::Tensor batch_rows;                 // data set rows of the batch (snapshots, replay); empty: unknown
  double lr = -1;                        // the LR the step runs with, for run.h5; < 0: the optimizer's
  GradientAverager* averager = nullptr;  // data parallel: every rank's gradients averaged
  bool stop_requested = false;           // Ctrl-C here, shared so every rank stops after the same step
};

struct GuardedStep {
  StepOutcome outcome;
  at::Tensor loss;  // the step's loss (a host scalar; NaN for a step whose loss was not finite)
  bool counted() const { return !outcome.skipped; }  // the update reached the weights
  Amp amp = Amp::fp32;                               // the precision the step ran in
  double lr = 0;
  double loss_scale = 1;              // the scale it ran with
  double seconds = 0;                 // wall time of the step
  std::string first_birth;            // format::capture_text of the forensic re-run; "" when not investigated
  std::string snapshot;               // the snapshot written, or ""
  bool fell_back = false;             // the whole-model fallback fired at this step
  Remedy remedy = Remedy::none;       // --fallback auto: what the diagnosis chose for this step
  std::vector<std::string> restored;  // buffers the skip put back (the forward had written them)
  std::string error;                  // the model raised during the step (the step was skipped)
  std::vector<std::string> warnings;  // early warnings that fired at this step
  int64_t rolled_back_to = -1;        // the run went back to the state after this step (-1: no rollback)
  // GuardOptions::doom_search, at a failing step: the earlier update that
  // doomed it ("step 40, batch row 3", "steps 12-19", "no earlier step"), or
  // why it was not searched; "" when the search is off or did not run.
  std::string doomed_by;
  int64_t doomed_by_step = -1;     // the dooming step (-1: none named)
  std::vector<int64_t> doom_rows;  // its batch rows without which the run survives (empty: its whole update)
};

class StepGuard {
 public:
  // A module of yours, trained by the closure step below. The guard keeps a
  // reference: the module and the optimizer must outlive it.
  StepGuard(torch::nn::Module& module, torch::optim::Optimizer& optimizer, GuardOptions options = {});
  StepGuard(const std::shared_ptr<torch::nn::Module>& module, torch::optim::Optimizer& optimizer,
            GuardOptions options = {})
      : StepGuard(*module, optimizer, std::move(options)) {}
  template <class Impl>
  StepGuard(const torch::nn::ModuleHolder<Impl>& module, torch::optim::Optimizer& optimizer, GuardOptions options = {})
      : StepGuard(*module.ptr(), optimizer, std::move(options)) {}
  // Any model whose parameters and buffers the body gives (the Python module's
  // model); trained by the closure step.
  StepGuard(std::unique_ptr<TrainableModel> body, torch::optim::Optimizer& optimizer, GuardOptions options);
  // A TrainableModel: trained by step(step, inputs, targets) (nanscope-train).
  StepGuard(TrainableModel& model, torch::optim::Optimizer& optimizer, GuardOptions options);
  // Without an optimizer: a loop with its own update rule (watched form). The
  // guard decides whether the update may be applied: a skipped step's
  // gradients are zeroed in place, so `p -= lr * grad` adds nothing.
  StepGuard(std::unique_ptr<TrainableModel> body, GuardOptions options);
  ~StepGuard();
  StepGuard(const StepGuard&) = delete;
  StepGuard& operator=(const StepGuard&) = delete;

  // One step on this batch (already on the model's device). Throws
  // ModelError (the model's own exception inside) when the model raised and
  // no birth explains it, anything at all with an averager (the peers are
  // waiting), and DeadRunError when nothing can save the run.
  GuardedStep step(int64_t step, const at::Tensor& inputs, const at::Tensor& targets, const StepContext& context = {});

  // One step whose forward and loss are `loss`, a closure over the step's
  // batch (which the guard checks, snapshots and replays). Steps are numbered
  // from 0 unless given. A closure that takes the batch (BatchLoss) also lets
  // the guard try the batch without one sample. Guards built from a module
  // (or a body) only; the same exceptions as above.
  GuardedStep step(int64_t step, const LossClosure& loss, const Batch& batch, const StepContext& context = {});
  GuardedStep step(int64_t step, const BatchLoss& loss, const Batch& batch, const StepContext& context = {});
  GuardedStep step(const LossClosure& loss, const Batch& batch, const StepContext& context = {}) {
    return step(next_step_, loss, batch, context);
  }
  GuardedStep step(const BatchLoss& loss, const Batch& batch, const StepContext& context = {}) {
    return step(next_step_, loss, batch, context);
  }
  // --- The watched form: the loop runs forward, loss, backward and its own
  // clipping; the guard is told where micro-batches begin and end, and decides.
  // The loss of any micro-batch, as the loop computes it: what the forensic
  // re-run, the fallback's diagnosis and replay run the step's micro-batches
  // with. Without it a non-finite watched step is skipped and logged, not
  // investigated.
  void set_loss_fn(BatchLoss loss) { loss_fn_ = std::move(loss); }
  // Autocast at the guard's precision (fp32 after a fallback) for one
  // micro-batch's forward and loss; also marks where the micro-batch begins.
  ScopedAutocast autocast();
  // A call of the model begins here (its RNG state is taken): optional,
  // autocast() and a Python module's forward hook call it; the hook calls
  // end_model_call() when it returns. Of several calls before a micro-batch's
  // loss, the one the loss's graph holds is its forward (decided on a failing step).
  void begin_micro_batch();
  void end_model_call();
  // backward() of one micro-batch's loss (as the loop weighted it), scaled
  // for fp16; the micro-batch is kept for a re-run. Opens a step if none is.
  void backward(const at::Tensor& loss, const Batch& micro_batch);
  // The same without the backward, for loops that call it (GradScaler's
  // scale()). `earlier_call_batches`: the arguments of the calls before the
  // latest since the last micro-batch (oldest first), when micro_batch is the
  // latest call's: the re-run takes the one the loss used. `changed_since_call`:
  // the loop wrote into micro_batch's tensors after the call (their version
  // counters moved), so the copy kept here is not what the forward saw.
  at::Tensor scale(const at::Tensor& loss, const Batch& micro_batch,
                   const std::vector<Batch>& earlier_call_batches = {}, bool changed_since_call = false);
  // Unscales the gradients now, before the loop's own clipping (GradScaler's
  // unscale_); the step's grad norm is taken here, before the clip.
  void unscale();
  // Ends the watched step: the one host read, then the optimizer's step (or
  // none: the loop's update) or the skip, and all a closure step does after.
  GuardedStep step(const StepContext& context = {});
  bool step_open() const { return watched_ != nullptr; }
  // The run was stopped (a DeadRunError was thrown): every later step, or
  // micro-batch, throws DeadRunError at once, saying why.
  bool stopped() const { return !stopped_.empty(); }
  void refuse_if_stopped() const;  // throws that DeadRunError when stopped()
  // Several ranks: this rank's step raised (`error`, one line), or its
  // collective with the others failed. The step cannot go on without every
  // rank, so the run stops here with one line (the step's open micro-batches
  // are dropped); the exception itself is the caller's to let through.
  void stop_for_failed_rank(int rank, const std::string& error);
  // The guard applies the optimizer's update (false: the loop's own rule).
  bool applies_update() const { return applies_update_; }
  // Without an optimizer: after a skipped step the loop applies its own
  // update anyway. Zeroed gradients make `p -= lr * grad` add nothing, but
  // weight decay or momentum in its rule would still move the weights: they go
  // back to the step's at the next micro-batch, or here (GradScaler's update()).
  void undo_loops_update();

  // The step number a step without one gets: one after the last step run.
  int64_t next_step() const { return next_step_; }
  // Steps without a number go on from `step` (a guard restored from a state_dict).
  void number_steps_from(int64_t step) { next_step_ = step; }

  Amp amp() const { return amp_; }
  // 1 until the fallback or a rollback, then lr_backoff for each of them. The
  // guard applies it to every update it makes (each group's LR times this for
  // the optimizer's step, then back), so the LR in the groups stays the
  // loop's: set by hand each iteration or by a scheduler, the cut survives.
  // A loop with its own update rule multiplies its LR by this.
  double lr_multiplier() const { return fallback_.lr_multiplier() * rollback_lr_multiplier_; }
  // Updates that reached the weights: the position of a schedule that holds on
  // skipped steps (nanscope-train --schedule-on-skip hold).
  int64_t applied_steps() const { return applied_steps_; }
  // The modules running in fp32 inside an autocast step.
  const std::vector<std::string>& fp32_modules() const { return fp32_modules_; }
  // The parameters, buffers and optimizer state, all finite? (slow: one reduction per tensor)
  StateHealth health() const;
  const BufferTransaction& buffer_transaction() const { return transaction_; }
  int64_t rollbacks() const { return rollback_.rollbacks(); }
  GuardState state() const;
  // Puts a saved state back (after the model and optimizer got theirs): a
  // fallback that had fired fires again (fp32, no scaler), without events.
  void restore(const GuardState& state);
  const StateRing& saved_states() const { return ring_; }
  int64_t fallback_step() const { return fallback_.fired_step(); }
  const LossScaler& scaler() const { return scaler_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const probe::Probe& probe() const { return probe_; }
  // run.h5 and the log: what a loop around the guard records of its own
  // (nanscope-train's refused checkpoint, a collective's error) goes here too.
  Journal& journal() { return journal_; }
  // nanscope-train's --fault and nanscope's own tests, not a user's loop: the
  // faults planted in the model at their steps (core/fault.hpp). Each step,
  // its re-runs and replays run with the one planted at its step.
  void plant_faults(std::vector<Fault> faults) { planted_ = std::move(faults); }
  const std::string& run_file() const;
  const std::vector<std::string>& snapshots() const { return snapshots_; }
  // Data parallel: the ranks whose own check failed at the first skip.
  const std::vector<int>& first_nonfinite_ranks() const { return first_nonfinite_ranks_; }

 private:
  StepGuard(std::unique_ptr<ClosureModel> model, torch::optim::Optimizer& optimizer, GuardOptions options);
  struct WithoutOptimizer {
    std::unique_ptr<ClosureModel> model;
    std::unique_ptr<torch::optim::Optimizer> stand_in;
  };
  StepGuard(WithoutOptimizer parts, GuardOptions options);
  static WithoutOptimizer stand_in_for(std::unique_ptr<TrainableModel> body);
  ClosureModel& closure_model();
  // A step between its begin and its end: what both forms share.
  struct Running;
  struct Watched;
  Running begin_step(int64_t step, const StepContext& context);
  GuardedStep end_step(Running& run, const std::vector<float>& act_absmax);
  GuardedStep run_closure_step(int64_t step, const Batch& batch, const StepContext& context);
  GuardedStep closure_step(int64_t step, const Batch& batch, const StepContext& context);
  GuardedStep watched_step(const StepContext& context);
  // body(), and with several ranks its exception stops the run first (stop_for_failed_rank).
  GuardedStep stopping_if_a_rank_fails(const GradientAverager* ranks, const std::function<GuardedStep()>& body);
  // The step's micro-batches can run again (a watched step needs a loss function).
  bool rerunnable(const Running& run) const;
  // Batches other than the step's own (a row left out, an earlier step) can
  // run: through the loss function, or a closure that takes its batch.
  bool runs_other_batches(const Running& run) const;
  bool other_batches_need_loss_fn(const Running& run) const;
  // Installs the loss function where runs_other_batches needs it.
  void run_batches_through_loss_fn(std::optional<ClosureModel::Step>& scope, const Running& run, const Batch& batch);
  void say_carried_state(int64_t step, const std::vector<Batch>& micro_batches);
  // A micro-batch the loop changed in place after its model call (the first
  // with a non-finite loss, else the first), or -1.
  int64_t changed_micro_batch(const Running& run) const;
  std::string changed_micro_batch_text(const Running& run) const;  // " the loop changed micro-batch K ..."
  // Each micro-batch that came after several model calls gets the call its loss used.
  void decide_micro_batches(Running& run);
  // The micro-batch a diagnosis re-runs: the one of the first birth.
  size_t diagnosed_micro_batch(const Running& run, const std::optional<format::Capture>& capture) const;
  // Once, on the first step: a NANSCOPE_MODULE_SCOPE name the model has no module for is a warning.
  void check_scope_names(int64_t step, const std::vector<std::string>& opened);
  void on_nonfinite_step(Running& run, const std::vector<float>& layer_grad_norm, const std::string& undone);
  // Forensics (step_guard_forensics.cpp): the failing step re-run under capture; nullopt when not re-run.
  std::optional<format::Capture> investigate(Running& run, const std::vector<float>& layer_grad_norm);
  std::string write_snapshot(const Running& run, size_t micro, const std::vector<float>& layer_grad_norm,
                             const format::Capture& capture, NamedTensors parameters);
  // A sharded model's forensics in lockstep: the ranks that found a birth,
  // this rank's snapshot decision, and the whole parameters it writes.
  struct RanksBorn {
    std::vector<int> births;
    std::optional<SnapshotPolicy::Decision> decision;  // this rank found a birth
    NamedTensors gathered;                             // this rank writes the snapshot
  };
  RanksBorn agree_on_births(GradientAverager& ranks, const std::optional<format::Capture>& capture, const Running& run);
  SnapshotPolicy::Decision snapshot_decision(const Running& run, const format::Capture& capture,
                                             const std::optional<RanksBorn>& born);
  void warn_if_heading_for_trouble(int64_t step, GuardedStep& result, const std::vector<float>& layer_grad_norm,
                                   const std::vector<float>& layer_act_absmax);
  // Several ranks of a sharded model save alike: each its own shards, on the same steps.
  void save_state_if_due(int64_t step, GradientAverager* ranks);
  // GuardOptions::doom_search: keeps what a replay of this step needs.
  void record_for_doom_search(const Running& run);
  // Searches back for the update that doomed this failing step; with
  // rollback on, goes back and replays the run without it. True when the
  // run was recovered so (nothing more to do for this step).
  bool search_dooming_step(Running& run, const std::optional<format::Capture>& capture);
  // --fallback auto's diagnosis of this failed step (re-runs of it).
  RemedyChoice diagnose(Running& run, const std::optional<format::Capture>& capture);
  // RecoveryPlan (step_guard_recovery.cpp): what decide_recovery needs of the
  // guard, and the one place its decision is carried out.
  RecoveryState recovery_state(int64_t step) const;
  void apply_recovery(int64_t step, GuardedStep& result, RecoveryTrigger trigger, const RecoveryPlan& recovery,
                      const std::string& birth = "");
  std::string undo_skipped_step(GuardedStep& result);
  // Throws std::invalid_argument naming planned fp32 modules the step did not run.
  void check_planned_fp32_modules(const std::vector<std::string>& missing);
  void roll_back(int64_t step, GuardedStep& result, const std::string& why);
  void fall_back(int64_t step, GuardedStep& result, const std::string& what);
  [[noreturn]] void stop_dead_run(int64_t step, const std::string& text);

  std::unique_ptr<ClosureModel> owned_model_;  // a guard built from a module (declared first: model_ refers to it)
  // Without an optimizer of the loop's: a stand-in holding the parameters
  // (rollback states, checkpoints), never stepped (declared first: optimizer_ refers to it).
  std::unique_ptr<torch::optim::Optimizer> no_optimizer_;
  TrainableModel& model_;
  torch::optim::Optimizer& optimizer_;
  bool applies_update_ = true;
  BatchLoss loss_fn_;
  std::unique_ptr<Watched> watched_;  // the watched step in progress
  GuardOptions options_;
  std::vector<at::Tensor> parameters_;
  probe::Probe probe_;
  LossScaler scaler_;
  FallbackPolicy fallback_;
  SnapshotPolicy snapshot_policy_;
  Journal journal_;  // run.h5 and the log: each decision's event and line from one call
  Amp amp_;
  std::vector<std::string> snapshots_;
  std::vector<int> first_nonfinite_ranks_;
  Sentinel sentinel_;
  RollbackPolicy rollback_;
  StateRing ring_;
  StepHistory history_;  // the steps since the oldest saved state (doom search only)
  // The last dooming step found and where (no recovery since): a later
  // failure it still explains is not searched again.
  struct DoomFound {
    int64_t at_step = -1;
    DoomFinding finding;
  };
  std::optional<DoomFound> doom_found_;
  double rollback_lr_multiplier_ = 1;
  int64_t last_applied_step_ = -1;  // the last step whose update reached the weights
  int64_t nonfinite_in_a_row_ = 0;  // non-finite steps since the last finite one (or rollback)
  int64_t nonfinite_since_ = -1;    // the first of them
  int64_t applied_steps_ = 0;
  BufferTransaction transaction_;
  std::vector<std::string> fp32_modules_;
  // --fallback auto: the remedy chosen for each first birth (birth_key), and
  // at which step: the same birth again needs no new diagnosis.
  std::map<std::string, std::pair<int64_t, RemedyChoice>> remedy_of_birth_;
  bool fp32_modules_checked_ = false;  // the planned names were checked against a step that ran them
  bool scope_names_checked_ = false;
  std::exception_ptr model_exception_;  // what the model threw in this step (ModelError::original)
  int64_t next_step_ = 0;
  std::string stopped_;                                  // "step S: why" once the run was stopped
  std::vector<Fault> planted_;                           // plant_faults()
  std::vector<at::Tensor> weights_before_loops_update_;  // undo_loops_update()
};

// Autocast for one micro-batch's forward and loss at the guard's precision
// (nothing at fp32), undone at the end of its scope.
class ScopedAutocast {
 public:
  ScopedAutocast(at::DeviceType device, Amp amp);
  ~ScopedAutocast();
  ScopedAutocast(ScopedAutocast&& other) noexcept;
  ScopedAutocast(const ScopedAutocast&) = delete;
  ScopedAutocast& operator=(const ScopedAutocast&) = delete;
  ScopedAutocast& operator=(ScopedAutocast&&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace nanscope
