#pragma once
// One optimizer step of the stock mixed-precision loop (playbook
// P4/P5/P7/P13/P14): forward + loss under autocast, backward on the scaled
// loss, unscale, one finiteness verdict and the grad norms copied to the host
// once, then clip and step, or skip with weights and optimizer state intact.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/closure_optimizer.hpp"
#include "nanscope/core/gradient_averager.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/step_outcome.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/probe/batch.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

// How a step's gradient norms are taken. `as_a_value`: as
// torch.nn.utils.get_total_norm takes them, op for op, for a norm something
// computes with: the guard's clip, the loop's unscale_() (its clip), the
// ranks' averaging. `for_the_record`: only the step's verdict and the run
// file read them; CPU float gradients are then read on the host
// (probe/host_norms.hpp), equal to LibTorch's to float rounding, at a fraction
// of a small step's cost. Either way the verdict is the same.
enum class GradNormUse { as_a_value, for_the_record };

struct StepSettings {
  Amp amp = Amp::fp32;
  double clip = 1.0;             // <= 0: no clipping
  bool parameter_norms = false;  // also bring back each parameter's grad norm
  // Early warnings: the batch's largest magnitude (one element, on the device), read back with the rest.
  at::Tensor batch_absmax{};
  // Data parallel: average gradients across ranks (nullptr: one process).
  GradientAverager* buckets = nullptr;
  // Several ranks: also bring back the averaged gradients' per-parameter norms
  // (the early warnings read them; without warnings they are not copied).
  bool averaged_parameter_norms = false;
  bool stop_requested = false;  // Ctrl-C here: shared so every rank stops after the same step
  // A finite step whose loss (all ranks' mean) is above this is skipped like a
  // non-finite one: the rollback policy's probation (rollback.hpp).
  double skip_loss_above = std::numeric_limits<double>::infinity();
  // The floating buffers the forward writes (BufferTransaction): a step that
  // leaves a value in one non-finite does not count, checked with the one host
  // read (a mask's own infinities are no such value).
  const std::vector<WrittenBuffer>* written_buffers = nullptr;
  // A watched step of several micro-batches: their losses as the loop gave
  // them (one element each, on the device), read back with the rest.
  at::Tensor micro_losses{};
  // Asked only when the loss is non-finite and every gradient finite (one
  // process): the micro-batches whose NaN loss is a mean over no target,
  // with exactly zero gradients, when that is every micro-batch whose loss
  // is non-finite and some other is not; otherwise none. Those add nothing
  // to the update: it goes on with the others (finish_step).
  std::function<std::vector<size_t>(const StepOutcome&)> losses_adding_nothing;
  // Several ranks whose backward averaged the gradients: the step's flags,
  // their reduction begun before step() (in DDP's last bucket, or at
  // unscale(): prepare_rank_flags), with what they were built from;
  // check_gradients finishes the reduction.
  struct BegunFlags {
    at::Tensor flags, own_nonfinite, buffers_bad;
  };
  std::optional<BegunFlags> begun_flags;
};

// Several ranks whose backward averaged the gradients (GradientAverager::
// own_gradients_nonfinite defined): builds this rank's flags from `loss` (the
// step's, as check_gradients gets it) and keeps them in
// settings.begun_flags, for a reduction begun before step(); check_gradients
// then waits for it (GradientAverager::average of the same flags). Undefined
// where the averager averages the gradients itself. The Python binding's
// communication hook calls it at DDP's last bucket and sends the flags in
// that bucket's reduction.
at::Tensor prepare_rank_flags(StepSettings& settings, const at::Tensor& loss);
struct UnscaledGradients;
// The watched form's unscale(): the flags' reduction begun, so that it
// overlaps what the loop does before step() (its clipping): where DDP's
// backward averaged the gradients, prepare_rank_flags' flags
// (GradientAverager::begin_average); for a sharded model, its flags with the
// squared norms of its gradient shards (`unscaled`), one sum
// (GradientAverager::begin_sum). Nothing where the averager averages the
// gradients itself, at step().
void begin_reducing_flags(StepSettings& settings, const at::Tensor& loss, const std::vector<at::Tensor>& parameters,
                          const UnscaledGradients& unscaled);

// What train_step throws when the update raises after the model's forward and
// backward ran (an optimizer's own error: Adam given sparse gradients): the
// gradients were found finite before it, so there is no NaN to look for, and
// the guard gives the loop `original`, the exception as it was thrown.
class UpdateRaised : public std::runtime_error {
 public:
  UpdateRaised(const std::string& what, std::exception_ptr original)
      : std::runtime_error(what), original(std::move(original)) {}
  std::exception_ptr original;
};

// `lr_multiplier`: the guard's LR cuts, for this update only (finish_step).
// An optimizer that evaluates a closure (L-BFGS) gets one that runs the step
// again; `evaluations` is told what they came to.
StepOutcome train_step(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                       const std::vector<at::Tensor>& parameters, const StepSettings& settings, const Batch& batch,
                       double lr_multiplier = 1.0, ClosureEvaluations* evaluations = nullptr);

// The phases after backward, for a step whose forward and backward the loop
// ran itself (StepGuard's watched form) as for train_step's own.
// Unscaled gradients and their norms, still on the device (no host read).
struct UnscaledGradients {
  at::Tensor found_inf;  // > 0: the scaler found an Inf/NaN while unscaling
  at::Tensor norms;      // one per defined gradient (undefined: none)
  at::Tensor total_norm;
  std::vector<bool> had_grad;  // per parameter: it had a gradient (the norms are theirs)
};
// P7: unscale before anything reads the gradients (a loop's own clipping).
UnscaledGradients unscale_gradients(LossScaler& scaler, const std::vector<at::Tensor>& parameters,
                                    const at::Tensor& like, GradNormUse use);
// The verdict (one host read), then clip and the optimizer's step (nullptr:
// the loop applies its own update rule), or the skip: on a skip the
// gradients are zeroed in place when `zero_grads_in_place` (a loop's own
// update then adds nothing), else dropped. `lr_multiplier` scales every
// group's LR for this step's update only (the guard's cuts; the loop's own LR
// stays in the groups). `unscaled`: from unscale_gradients, when the loop
// unscaled before clipping.
struct StepFinish {
  torch::optim::Optimizer* optimizer = nullptr;
  bool zero_grads_in_place = false;
  double lr_multiplier = 1.0;
  const UnscaledGradients* unscaled = nullptr;
  // An optimizer that evaluates a closure (closure_optimizer.hpp): what runs
  // the step again at its trial weights, and where the evaluations are told.
  std::function<Evaluation()> reevaluate;
  ClosureEvaluations* evaluations = nullptr;
};
StepOutcome finish_step(LossScaler& scaler, const std::vector<at::Tensor>& parameters, const StepSettings& settings,
                        const at::Tensor& loss, const StepFinish& finish);

at::ScalarType autocast_dtype(Amp amp);

// P13: scales the gradients down to a global norm of `clip` when `grad_norm`
// (theirs, after unscaling) is above it; clip <= 0: nothing.
void clip_gradients(const std::vector<at::Tensor>& parameters, double grad_norm, double clip);

// The gradients that exist (parameters unused by the step have none).
std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& parameters);
// Per-gradient L2 norms in one tensor (what the step's host read copies) and
// the global norm over all of them; on the device.
struct GradNorms {
  at::Tensor each, total;
};
GradNorms grad_norms(const std::vector<at::Tensor>& grads, GradNormUse use);

// The step without its optimizer: `setup` in force, forward + backward on
// loss x loss_scale, unscale, the global grad norm (ops of that last part run
// in capture's "grad_norm" phase). What the probe's forensic re-run and
// replay repeat. Leaves the gradients for the caller to clear, and the
// model's buffers as it found them (a re-run is no training step); a buffer
// the re-run turned non-finite makes it non-finite, as it does the step.
struct StepRecomputation {
  at::Tensor loss, found_inf, total_norm;
  at::Tensor buffers_bad;  // undefined for a model without floating buffers
  // Each micro-batch's weight read off its recorded loss (the loop's loss /
  // the loss function's, on the same batch); NaN where none was read.
  std::vector<double> derived_weights;
  bool finite() const;  // reads them on the host
};
StepRecomputation recompute_step(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp,
                                 double loss_scale, const StepSetup& setup, const Batch& batch);
// The same over a step's micro-batches, in order, each from its own RNG state
// and with its loop's loss weight, gradients accumulating as in the step;
// `capture` (the forensic re-run's) is told where each micro-batch begins.
StepRecomputation recompute_step(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp,
                                 double loss_scale, const StepSetup& setup,
                                 const std::vector<MicroBatch>& micro_batches, probe::OpCapture* capture = nullptr);

// Forward + loss under autocast, backward on loss x loss_scale: the part of a
// step that the probe's forensic re-run repeats. Returns the unscaled loss.
at::Tensor forward_backward(TrainableModel& model, Amp amp, double loss_scale, const Batch& batch);

}  // namespace nanscope
