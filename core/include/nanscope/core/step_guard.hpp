#pragma once
// The stock mixed-precision step around a training loop of your own. The
// closure form runs the step for you:
//
//   nanscope::StepGuard guard(net, optimizer, {"my-run", nanscope::Amp::bf16});
//   for (auto& batch : *loader) {
//     auto r = guard.closure_step([&] { return torch::nll_loss(net->forward(batch.data), batch.target); }, batch);
//     if (!r.counted()) std::cout << r.first_birth << "\n";
//   }
//
// The watched form leaves the whole step to your loop, as GradScaler does:
//
//   guard.set_loss_fn(loss_of);                   // loss_of(micro_batch): for the forensic re-run
//   for (auto& micro : micro_batches) {
//     auto autocast = guard.autocast();           // the guard's precision (fp32 after a fallback)
//     guard.backward(loss_of(micro) / accumulation, micro);
//   }
//   nanscope::GuardedStep r = guard.step();       // the verdict; optimizer.step() or a skip
//
// A skip is a transaction (weights, optimizer state and the buffers the
// forward wrote are as before the step). A non-finite step is re-run under
// op-level capture to name its first birth, snapshotted for nanscope-replay,
// and met by the fallback (docs/cpp.md, docs/recovery.md). Every step is a
// row of RUN_DIR/run.h5. nanscope-train's loop is this guard.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>

#include "nanscope/core/guard_errors.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/guard_state.hpp"
#include "nanscope/core/guarded_model.hpp"
#include "nanscope/core/guarded_step.hpp"
#include "nanscope/core/loss_closure.hpp"
#include "nanscope/core/other_model.hpp"
#include "nanscope/core/scoped_autocast.hpp"

namespace nanscope {

struct StateHealth;

class StepGuard {
 public:
  StepGuard(GuardedModel model, torch::optim::Optimizer& optimizer, GuardOptions options = {});
  // Without an optimizer: a loop with its own update rule (watched form). A
  // skipped step's gradients are zeroed, so `p -= lr * grad` adds nothing.
  StepGuard(GuardedModel model, GuardOptions options);
  ~StepGuard();
  StepGuard(const StepGuard&) = delete;
  StepGuard& operator=(const StepGuard&) = delete;

  // --- The closure form (Python's closure_step). Each step throws
  // ModelError (the model's own exception inside) when the model raised and
  // no birth explains it, anything at all with an averager (the peers are
  // waiting), and DeadRunError when nothing can save the run. The step's
  // number is context.step, or one after the last step run.
  // `loss` is the forward and loss over `batch` (which the guard checks,
  // snapshots and replays); a BatchLoss also lets it try the batch without
  // one sample.
  GuardedStep closure_step(const LossClosure& loss, const Batch& batch, const StepContext& context = {});
  GuardedStep closure_step(const BatchLoss& loss, const Batch& batch, const StepContext& context = {});
  // A TrainableModel's step: its loss(inputs, targets) is the forward.
  GuardedStep closure_step(const at::Tensor& inputs, const at::Tensor& targets, const StepContext& context = {});

  // --- The watched form, in this order each step (a call out of it throws
  // std::logic_error): model calls and micro-batch losses, unscale() at most
  // once, then step().
  // What re-runs the step's micro-batches; without it a non-finite watched
  // step is skipped and logged, not investigated.
  void set_loss_fn(BatchLoss loss);
  ScopedAutocast autocast();  // one micro-batch's forward and loss; marks where it begins
  // A call of the model begins (its RNG state is taken); of several calls
  // before a loss, the one the loss's graph holds is its forward.
  void begin_micro_batch();
  // backward() of one micro-batch's loss (as the loop weighted it), scaled for fp16.
  void backward(const at::Tensor& loss, const Batch& micro_batch);
  // The same without the backward (GradScaler's scale()). `earlier_call_batches`:
  // the arguments of the calls before the latest since the last micro-batch,
  // oldest first; `changed_since_call`: the loop wrote into micro_batch's
  // tensors after the call, so what is kept here is not what the forward saw.
  // The batch is kept as it is now, for a re-run: the loop's own tensors,
  // checked at step() against a later in-place write, or a copy (the first
  // step, and every step once the loop was seen making such a write).
  at::Tensor scale(const at::Tensor& loss, const Batch& micro_batch,
                   const std::vector<Batch>& earlier_call_batches = {}, bool changed_since_call = false);
  // Before the loop's own clipping (GradScaler's unscale_): divides by the
  // loss scale and takes the step's grad norm. Returns that norm as torch's
  // clip_grad_norm_ takes it (the 2-norm of the per-gradient 2-norms; a
  // 0-dim tensor, not read to the host), so a clip need not take it again.
  at::Tensor unscale();
  GuardedStep step(const StepContext& context = {});  // the verdict, then the update or the skip
  // Without an optimizer, after a skip: weight decay or momentum in the loop's
  // own rule moved the weights anyway; back to the step's (GradScaler's update()).
  void undo_loops_update();

  // --- The run.
  // Once stopped (a DeadRunError was thrown), every later call throws it again.
  bool stopped() const;
  Amp amp() const;
  // 1 until the fallback or a rollback cut it; applied to each update the guard
  // makes (a loop with its own rule multiplies its LR by it).
  double lr_multiplier() const;
  int64_t applied_steps() const;  // updates that reached the weights
  const std::vector<std::string>& fp32_modules() const;
  StateHealth health() const;  // every parameter, buffer and optimizer state finite? (slow)
  int64_t rollbacks() const;
  int64_t fallback_step() const;
  double loss_scale() const;  // 1 where no loss scaling runs
  bool scaling() const;       // fp16's loss scaler runs
  GuardState state() const;
  void restore(const GuardState& state);  // after the model and optimizer got theirs
  // The run's buffered rows written out (before a checkpoint of your own,
  // which a resume continues from).
  void flush();
  const std::string& run_file() const;
  const std::vector<std::string>& snapshots() const;
  // Another model the loss runs (a GAN's critic in the generator's loss):
  // re-runs put its buffers back, a birth in it is named '<not in the model>
  // LABEL.path', and snapshots keep its weights (other_model.hpp).
  void add_other_model(const OtherModel& other);

 private:
  friend class StepGuardHarness;  // the tools' calls (Python's hooks, nanscope-train's records)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanscope
