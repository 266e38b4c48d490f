#pragma once
// --fallback auto: the remedy the failed step's own cause supports, in place
// of the stock loop's one answer (fp32 for the rest of the run, LR cut) to
// every non-finite step. The cause is classify_cause's (cause.hpp), the rule
// nanscope-replay's verdict follows too; the diagnosis gathers its evidence
// with a few re-runs of the failed step (docs/recovery.md):
//   data       a non-finite input, a loss over no counted target, or a batch
//              finite without samples far out of its range: skip, nothing else
//   model_or_data  non-finite with autocast off too: precision is not the
//              cause, so no fp32 remedy; skip, and say what the row search
//              found (the ordinary samples that trigger an unsafe op), or
//              why it could not run
//   transient  the re-run of the same step is finite (a kernel's fluke):
//              skip, nothing else
//   compiler   a compiled model's step, finite run eagerly and non-finite
//              compiled again: skip, and name the module to run eagerly
//   kernel     the born op has other kernels here and one of them makes
//              the step finite: that kernel is pinned for the rest of the
//              run, inside the born op's module for attention's
//              (RecoveryMemory::pin_kernel); no fp32
//   undiagnosed  the re-run with autocast off raised: no evidence for a
//              fallback, so skip, nothing else, and say what raised
//   precision  finite with autocast off: the smallest set of modules that,
//              in fp32, makes the step finite goes to fp32 for the rest of
//              the run, the rest stays low precision; no LR cut
//   whole      the stock fallback, when no smaller set helps, no birth names
//              a module to search from, or no fp32 re-run can be made (a
//              model of its own 16-bit weights: the LR cut alone)
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/cause.hpp"
#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/probe/batch.hpp"

namespace nanscope {

struct RemedyChoice {
  Remedy remedy = Remedy::whole_fp32;
  std::vector<std::string> modules;  // fp32_modules: the ones to add; kernel: the born op's module
  std::string why;                   // one line for the event and the log
  // fp32_modules: median wall time of a re-run of the step without and with them.
  double seconds_before = 0, seconds_after = 0;
  // Several ranks: this rank did not diagnose the step (its own batch's
  // check passed, another rank's failed): the ranks' agreement decides.
  bool no_say = false;
  // The cause the diagnosis found (its rows are rows of the diagnosed
  // micro-batch); nullopt when the step could not be diagnosed.
  std::optional<Cause> cause{};
  // The samples that trigger it (the input birth's row, or the cause's rows),
  // as Batch::row_fingerprint has them: the same fault met again is the
  // same birth with one of these samples.
  std::vector<uint64_t> trigger_samples{};
  // The same samples' rows in the data set, where the loop gave the step's
  // data set rows (StepContext::batch_rows) for a step of one micro-batch;
  // empty otherwise. A `data` remedy lists them in the run's poison list.
  std::vector<int64_t> trigger_dataset_rows{};
  // kernel: the one pinned, and the re-runs that chose it.
  format::Kernel kernel = format::Kernel::unknown;
  std::optional<format::KernelTrials> kernel_trials{};
};

// Re-runs of the failed step: same weights, buffers, RNG state, batch, setup
// and loss scale; some modules in fp32; optionally without one batch row.
class StepReruns {
 public:
  virtual ~StepReruns() = default;
  virtual bool finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row = -1) = 0;
  // The last finite() raised instead of running to its end: its false is no
  // evidence of a non-finite step; last_error() says what it raised.
  virtual bool raised() const { return false; }
  virtual std::string last_error() const { return ""; }
  // The step with sample `row` replaced by a copy of sample `by`: every
  // shape stays, so a step that draws random numbers draws the same ones.
  // A re-run source that cannot replace rows answers as without the row.
  virtual bool finite_with_row_replaced(Amp amp, const std::vector<std::string>& fp32_modules, int64_t row,
                                        int64_t /*by*/) {
    return finite(amp, fp32_modules, row);
  }
  // The step draws random numbers (dropout, randn_like): a re-run without a
  // row draws differently after it, so the row search replaces rows instead
  // of removing them (nanscope-replay alike). Known after a whole-batch re-run.
  virtual bool draws_random_numbers() { return false; }
  // The batch's samples are list items (Batch::sample_lists): a row is
  // replaced by another, never removed.
  virtual bool rows_are_list_items() { return false; }
  // The modules the forward runs ops in (op capture on one re-run).
  virtual std::vector<std::string> modules_seen() = 0;
  // Of `rows`, those out of the batch's range (Batch::rows_out_of_range at
  // kRowOutOfRangeFactor); none where the batch cannot be read.
  virtual std::vector<int64_t> rows_out_of_range(const std::vector<int64_t>&) { return {}; }
  // Why no row can be cut from the batch (a tensor that holds its samples
  // along two dimensions alike, Batch::ambiguous_rows), or "".
  virtual std::string ambiguous_rows() { return ""; }
  // A TorchScript model whose module frames could not be switched.
  virtual bool unswitchable() const = 0;
};

struct FailedStep {
  Amp amp = Amp::bf16;
  // The model's own 16-bit weight type ("bfloat16"), "" for wider weights:
  // with autocast off it still computes in it, so no fp32 re-run is tried.
  std::string own_16bit;
  bool batch_finite = true;
  std::optional<format::Capture> capture;  // the forensic re-run's; nullopt: not investigated
  // The rows of the micro-batch re-run; 0 when its rows cannot be re-run
  // alone (a step that runs other batches besides it).
  int64_t batch_size = 0;
  std::vector<std::string> fp32_modules;  // already in fp32
  bool on_cpu = true;                     // the model's device: which kernels its ops have
  // The born op's other kernels may be tried: not under lockstep re-runs (a
  // sharded model), whose other ranks would run theirs unpinned, nor for a
  // compiled model, whose kernels are its compiler's (nanscope-replay alike).
  bool kernels_tried = true;
};

// Batches up to this many rows are searched for a sample without which the
// step is finite (one re-run per row); larger ones are not.
inline constexpr int64_t kMaxRowsSearched = 64;

RemedyChoice choose_remedy(const FailedStep& failed, StepReruns& reruns);

// One re-run of a step, what the guard's diagnosis and nanscope-replay both
// do: the CPU generator back at `cpu_rng_state` (when defined), the loss scale
// for fp16 only, `fp32_modules` in fp32 below fp32, recompute_step (buffers
// kept), gradients cleared. An exception is a non-finite step: its one line
// goes to `error`. `switchable` turns false when a TorchScript model's
// modules could not be switched to fp32.
// `micro` is the step's batch (or the micro-batch of a step of several that
// holds its first birth: the unit every diagnosis re-runs) with its RNG state.
// `derived_weight`: the weight read off its recorded loss (NaN if none was).
bool rerun_is_finite(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp, double loss_scale,
                     const StepSetup& setup, const MicroBatch& micro, const std::vector<std::string>& fp32_modules,
                     bool* switchable = nullptr, std::string* error = nullptr, double* derived_weight = nullptr);

// The loop's weight of a micro-batch's loss (1 / accumulation steps) is read
// off its recorded loss on the whole micro-batch, once: a re-run without a row
// has another loss, and reading the weight off that (a sample whose loss is
// 1e35 taken out) would scale the re-run by the ratio of the two. Fixes
// `micro`'s weight to `derived` (when one was read) and forgets its recorded loss.
void fix_loss_weight(MicroBatch& micro, double derived);

// StepReruns on the live model: each re-run restores the CPU generator to
// the step's state and leaves the buffers as found (recompute_step).
class LiveStepReruns : public StepReruns {
 public:
  LiveStepReruns(TrainableModel& model, const std::vector<at::Tensor>& parameters, double loss_scale,
                 const StepSetup& setup, MicroBatch micro);
  bool finite(Amp amp, const std::vector<std::string>& fp32_modules, int64_t without_row) override;
  bool finite_with_row_replaced(Amp amp, const std::vector<std::string>& fp32_modules, int64_t row,
                                int64_t by) override;
  std::vector<std::string> modules_seen() override;
  std::vector<int64_t> rows_out_of_range(const std::vector<int64_t>& rows) override;
  std::string ambiguous_rows() override;
  bool unswitchable() const override { return !switchable_; }
  bool raised() const override { return !last_error_.empty(); }
  std::string last_error() const override { return last_error_; }
  bool draws_random_numbers() override;
  bool rows_are_list_items() override { return micro_.batch.sample_lists().rows > 0; }
  // draws_random_numbers() needs no re-run of its own: a whole-batch re-run
  // already showed it, or the step kept no generator state to compare with.
  bool draws_known() const { return draws_.has_value() || !micro_.cpu_rng_state.known(); }

 private:
  TrainableModel& model_;
  const std::vector<at::Tensor>& parameters_;
  double loss_scale_;
  StepSetup setup_;
  MicroBatch micro_;
  bool switchable_ = true;
  std::string last_error_;     // what the last re-run raised, "" when it ran
  std::optional<bool> draws_;  // seen on the first whole-batch re-run
  bool weight_read_ = false;   // its loss weight too (fix_loss_weight)
};

}  // namespace nanscope
