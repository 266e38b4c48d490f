#pragma once
// What one step came to: the verdict of its one host read (finite or not, per
// rank and for all), its loss and norms, and whether it was skipped. Apart
// from train_step.hpp, so that a loop's include of the guard pulls no
// optimizer or probe headers.
#include <vector>

namespace nanscope {

// With several ranks, loss_finite/grads_finite are every rank's verdict (the
// flags summed across them), so all ranks skip, back off and fall back
// together; the local_* fields are this rank's own check, made before the
// gradient all-reduce mixed the ranks' gradients.
struct StepOutcome {
  double loss = 0;         // unscaled, this rank's batch
  double global_loss = 0;  // every rank's loss averaged (several ranks); = loss for one process
  double grad_norm = 0;    // global (all ranks' averaged gradients), after unscale, before clipping
  bool loss_finite = true;
  bool grads_finite = true;
  // The buffers the forward wrote are finite (several ranks: a rank whose
  // buffers went non-finite counts as its gradients did, so all ranks skip).
  bool buffers_finite = true;
  bool skipped = false;
  bool batch_finite = true;       // the step's own micro-batches: known on a failed step, with the probe
  double batch_absmax = 0;        // when StepSettings asked for it (several ranks: the largest of all ranks)
  bool skipped_as_spike = false;  // finite, but its loss was above StepSettings::skip_loss_above
  bool local_loss_finite = true;
  bool local_grads_finite = true;
  std::vector<int>
      nonfinite_ranks;  // ranks whose own check failed (one process: {0} or {}; sharded: whose loss, if any did)
  double allreduce_seconds = 0;        // wall time in the gradient all-reduce (0: one process)
  bool stop_requested = false;         // some rank was interrupted (several ranks)
  std::vector<float> parameter_norms;  // when asked for; one per parameter, this rank's gradients (DDP's: averaged)
  // Several ranks, when asked for: one per parameter, the averaged gradients (the same on every rank).
  std::vector<float> global_parameter_norms;
  std::vector<float> micro_losses;  // when StepSettings gave them
  // Micro-batches whose NaN loss was a mean over no target, with exactly
  // zero gradients (StepSettings::losses_adding_nothing): left out of the
  // loss, the update went on with the others.
  std::vector<size_t> adding_nothing;
  bool finite() const { return loss_finite && grads_finite && buffers_finite; }
  bool locally_finite() const { return local_loss_finite && local_grads_finite; }
};

}  // namespace nanscope
