// Forensics (forensics.hpp): the failing step re-run under op-level capture
// to name where its first NaN/Inf was born, the snapshot that lets
// nanscope-replay run it again, and --fallback auto's remedy from that
// diagnosis.
#include "failed/forensics.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>
#include <utility>

#include "failed/lockstep_reruns.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/core/compiled_region.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/guard_errors.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/snapshot.hpp"

namespace nanscope {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The data set rows of micro-batch `micro`: its stretch of the step's rows
// (StepContext::batch_rows, each micro-batch's in order), when they number
// the micro-batches' rows; undefined when the loop gave none.
at::Tensor micro_batch_rows(const RunningStep& run, size_t micro) {
  const at::Tensor& rows = run.context.batch_rows;
  if (!rows.defined()) return {};
  int64_t total = 0, offset = 0;
  for (size_t m = 0; m < run.micro_batches.size(); ++m) {
    if (m == micro) offset = total;
    total += run.micro_batches[m].batch.rows();
  }
  if (rows.numel() != total) return {};
  return rows.reshape(-1).narrow(0, offset, run.micro_batches.at(micro).batch.rows());
}

}  // namespace

AtFailedEvaluation::AtFailedEvaluation(const std::vector<at::Tensor>& parameters, const ClosureEvaluations& evaluations)
    : parameters_(parameters) {
  if (evaluations.failed_point.size() != parameters.size()) return;
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    before_.push_back(parameters[i].detach().clone());
    at::Tensor p = parameters[i];
    p.copy_(evaluations.failed_point[i]);
  }
}

AtFailedEvaluation::~AtFailedEvaluation() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < before_.size(); ++i) {
    at::Tensor p = parameters_[i];
    p.copy_(before_[i]);
  }
}

Forensics::Forensics(Steered& steered, const std::vector<at::Tensor>& parameters, probe::Probe& probe, Journal& journal,
                     ForensicsMemory& memory, const RecoveryMemory& recovered, const GuardOptions& options)
    : steered_(steered),
      parameters_(parameters),
      probe_(probe),
      journal_(journal),
      memory_(memory),
      recovered_(recovered),
      options_(options) {}

ForensicFindings Forensics::investigate(const RunningStep& run, const std::vector<float>& layer_grad_norm,
                                        std::exception_ptr model_exception) {
  // Weights that already hold the NaN/Inf were made so by an earlier update
  // (or loaded so): no op of this step is its birth, and a re-run from them
  // would name none. Taken before a closure optimizer's trial point is put
  // in. A sharded model's ranks re-run in lockstep as ever (each holds shards).
  std::vector<std::string> nonfinite_weights;
  if (options_.probe && !(run.context.averager && run.context.averager->sharded()))
    nonfinite_weights = nonfinite_parameters(steered_.model);
  ForensicFindings found;
  {
    const AtFailedEvaluation trial_point(parameters_, run.evaluations);
    found = investigate_at_trial_point(run, nonfinite_weights, layer_grad_norm, std::move(model_exception));
  }
  found.first_birth = told_across_ranks(run, found.first_birth);
  return found;
}

std::string Forensics::born_elsewhere(const std::vector<int>& births, const std::string& birth) const {
  const std::string where = "born on rank(s) " + format::rank_list_text(births) + ", not on rank " +
                            std::to_string(options_.rank) + " (" +
                            format::run_file_name(births.front(), options_.world_size) + " has the rest)";
  if (birth.empty()) return "none on rank " + std::to_string(options_.rank) + ": " + where;
  return birth + ", on rank " + std::to_string(births.front()) + "; " + where;
}

// The birth as the first rank that found it says it, on every rank (two
// sums, on a failed step of several ranks only): a rank whose own step was
// finite logs the birth itself, with its rank, not only whose it was.
std::string Forensics::birth_from_rank(GradientAverager& ranks, const std::vector<int>& births,
                                       const std::string& mine) const {
  return births.empty() ? std::string() : text_from_rank(ranks, births.front(), mine);
}

// Several replicated ranks, once each has investigated (or not): the first
// rank whose own check failed tells its birth line to every rank (two sums,
// on a failed step only), and a rank that re-ran nothing logs that birth,
// with its rank, not only whose it was. (Sharded ranks agree in lockstep,
// agree_on_births.)
std::string Forensics::told_across_ranks(const RunningStep& run, const std::string& first_birth) {
  GradientAverager* const ranks = run.context.averager;
  const std::vector<int>& sick = run.outcome.nonfinite_ranks;
  if (!options_.probe || !ranks || ranks->sharded() || sick.empty()) return first_birth;
  const std::string told = birth_from_rank(*ranks, sick, first_birth);
  const bool mine = std::find(sick.begin(), sick.end(), options_.rank) != sick.end();
  if (mine || !first_birth.empty()) return first_birth;
  const std::string elsewhere = born_elsewhere(sick, told);
  journal_.record(run.step, format::EventKind::first_birth, elsewhere, "first birth: ");
  return elsewhere;
}

// Forensics where the fault is: a rank whose own check failed re-runs its
// own batch; if none did (only the averaged gradients overflowed), rank 0.
// A sharded model's forward and backward are collectives (they gather the
// parameters and scatter the gradients, and its reduce-scatter spreads one
// rank's NaN to every rank): every rank re-runs its own micro-batches in
// lockstep, each finds the births of its own, and one collective tells every
// rank which ranks found one.
bool Forensics::investigates(const RunningStep& run, bool birth_known) const {
  const StepOutcome& outcome = run.outcome;
  const bool lockstep = run.context.averager && run.context.averager->sharded();
  return options_.probe && (steered_.rerunnable(run.watched) || birth_known) &&
         (lockstep ? !outcome.finite()
                   : !outcome.locally_finite() || !outcome.buffers_finite ||
                         (outcome.nonfinite_ranks.empty() && options_.rank == 0));
}

// The failing step re-run under op-level capture (eagerly, and compiled
// again for a compiled model), its first birth said, its snapshot written.
ForensicFindings Forensics::investigate_at_trial_point(const RunningStep& run,
                                                       const std::vector<std::string>& nonfinite_weights,
                                                       const std::vector<float>& layer_grad_norm,
                                                       std::exception_ptr model_exception) {
  const int64_t step = run.step;
  const StepOutcome& outcome = run.outcome;
  GradientAverager* const ranks = run.context.averager;
  const bool lockstep = ranks && ranks->sharded();
  // A watched step's micro-batches can be run again only through the loop's loss function.
  std::vector<Batch> batches;
  for (const MicroBatch& micro : run.micro_batches) batches.push_back(micro.batch);
  ForensicFindings found;
  // Weights that held the NaN/Inf as the step began, or else a micro-batch
  // that holds it, are the birth (the weights first, as nanscope-replay
  // reads them): no re-run needed, so such a skip costs about one step.
  const bool weights_born = !nonfinite_weights.empty();
  if (weights_born) {
    found.capture.emplace();
    found.capture->nonfinite_weights = nonfinite_weights;
    found.capture->reproduced = true;  // non-finite from the start, with no re-run
  } else if (options_.probe && !outcome.batch_finite && !steered_.rerunnable(run.watched)) {
    // No loss function to re-run with: the batch's NaN/Inf is taken as read.
    // With one, the re-run says whether the step read it (a leaf it never
    // reads is no birth).
    found.capture = probe::Probe::input_capture(batches);
    if (!found.capture->first_birth) found.capture.reset();  // another rank's batch: this one re-runs as usual
  }
  const bool investigate = investigates(run, found.capture.has_value());
  // In lockstep a rank whose input holds the NaN re-runs too (its peers'
  // re-runs wait for its part of each collective); its input stays the birth.
  std::optional<format::Capture> input_birth;
  if (lockstep && found.capture && steered_.rerunnable(run.watched))
    input_birth = std::exchange(found.capture, std::nullopt);
  if (options_.probe && !steered_.rerunnable(run.watched) && !found.capture) {
    found.first_birth =
        "not investigated: no loss function to re-run the step with (StepGuard::set_loss_fn; "
        "Python: loss_fn=)";
    journal_.say(step, "first birth: " + found.first_birth);
  }
  std::string compiled_cost;  // a compiled model's: what running it eagerly (and the check) cost
  if (investigate && found.capture && !weights_born)
    keep_skipped_inputs(step, batches);
  else if (investigate && !found.capture) {
    found.capture = rerun_under_capture(run, batches, compiled_cost);
    const std::optional<format::Birth>& birth = found.capture->first_birth;
    if (birth && birth->op.phase == format::Phase::input) keep_skipped_inputs(step, batches);
  }
  if (input_birth) found.capture = std::move(input_birth);
  std::optional<RanksBorn> born;
  if (lockstep && options_.probe && !outcome.finite()) born = agree_on_births(*ranks, found.capture, run);
  if (!investigate) return found;
  const format::Capture& capture = *found.capture;
  if (!run.error.empty() && !capture.first_birth && capture.nonfinite_weights.empty()) {
    journal_.flush();
    throw ModelError(
        "step " + std::to_string(step) + ": the model raised, and no NaN or Inf was born before it: " + run.error,
        std::move(model_exception));
  }
  // A GAN's generator phase runs the critic in train mode on a sick fake
  // batch: the critic's BatchNorm statistics go non-finite outside any of
  // its steps, and its next step is where they show. Re-run from the
  // buffers its skip put back, that step is finite.
  found.buffers_written_outside = capture.ops_seen >= 0 && !capture.first_birth && !capture.reproduced &&
                                  !outcome.buffers_finite && run.calls_outside_losses > 0;
  found.first_birth = first_birth_text(run, capture, born, found.buffers_written_outside);
  journal_.record(step, format::EventKind::first_birth, found.first_birth,
                  "first birth: ", compiled_cost.empty() ? "" : " (" + compiled_cost + ")");
  found.snapshot = keep_snapshot(run, found.capture, born, layer_grad_norm, found.buffers_written_outside);
  return found;
}

// The input already holds the birth: said if it came again after a skip,
// and kept to tell a data set reused every step from carried state next time.
void Forensics::keep_skipped_inputs(int64_t step, const std::vector<Batch>& batches) {
  if (recovered_.nonfinite_in_a_row() == 1) say_carried_state(step, batches);
  skipped_inputs_.clear();
  for (const Batch& b : batches) skipped_inputs_.push_back(b.copied());
}

// The same step again: same weights (it was skipped), RNG state (restored by
// the probe, and per micro-batch), precision, loss scale, micro-batches and
// the harness's setup of the step (run.setup).
format::Capture Forensics::rerun_under_capture(const RunningStep& run, const std::vector<Batch>& batches,
                                               std::string& compiled_cost) {
  bool rerun_nonfinite = false;  // what the re-run itself came to, seen by the capture or not
  // Another guard may have named this model's tensors since (a GAN's two
  // guards, one told of the other's model as an outside one): this one's names.
  register_tensor_owners(steered_.model);
  std::optional<Fp32ModuleRegions> fp32;
  if (run.watched && fp32_regions_apply(run.amp, recovered_.fp32_modules()))
    fp32.emplace(steered_.model, recovered_.fp32_modules());
  auto rerun = [&](probe::OpCapture& op_capture) {
    rerun_nonfinite = !recompute_step(steered_.model, parameters_, run.amp, run.loss_scale_for_reruns(), run.setup,
                                      run.micro_batches, &op_capture)
                           .finite();
  };
  format::Capture capture;
  {
    std::optional<ClosureModel::Step> with_loss_fn;
    if (run.watched) with_loss_fn.emplace(steered_.closure_model(), steered_.loss_fn, batches.front());
    const auto start = std::chrono::steady_clock::now();
    capture = probe_.investigate(rerun, batches);
    if (steered_.model.compiled()) {
      // The re-run ran eagerly, op by op: a compiled program's fault is not
      // there to see. Finite and no birth: run the step compiled too.
      compiled_cost = "eager re-run " + seconds_text(seconds_since(start));
      const bool eager_clean = !rerun_nonfinite && capture.ops_seen >= 0 && !capture.first_birth;
      compiled_cost += check_compiled_step(run, capture, eager_clean);
    }
  }
  // With no birth, the re-run's own verdict says whether it reproduced the
  // step: non-finite again though no op was seen making it (a fused or
  // compiled kernel) is reproduced, never "transient"; finite is not, though
  // ops made infinities on the way (a causal mask's masked_fill(-inf)).
  if (capture.ops_seen >= 0 && !capture.first_birth) capture.reproduced = rerun_nonfinite;
  clear_grads(parameters_);
  return capture;
}

// A compiled model whose eager re-run was clean runs the step compiled again:
// only the compiled program fails, and (one process) in which module. Returns
// what that cost, as a clause.
std::string Forensics::check_compiled_step(const RunningStep& run, format::Capture& capture, bool eager_clean) {
  GradientAverager* const ranks = run.context.averager;
  const auto start = std::chrono::steady_clock::now();
  auto compiled_nonfinite = [&] {
    bool nonfinite = false;
    try {
      nonfinite = !recompute_step(steered_.model, parameters_, run.amp, run.loss_scale_for_reruns(), run.setup,
                                  run.micro_batches)
                       .finite();
    } catch (const std::exception&) {
      // A compiled run that raised says nothing of the values it makes.
    }
    clear_grads(parameters_);
    return nonfinite;
  };
  if (ranks && ranks->sharded()) {
    // A sharded model's compiled program is a collective too: when no rank's
    // eager re-run met the fault, every rank runs its own micro-batches
    // compiled once more, together, and the verdict is every rank's. The
    // region search (a run per module tried) is not run.
    if (!ranks->every_rank(eager_clean)) return "";
    capture.compiled_only = !ranks->every_rank(!compiled_nonfinite());
    return ", compiled re-run on every rank " + seconds_text(seconds_since(start)) +
           " (its region is not searched on a sharded model)";
  }
  if (!eager_clean) return "";
  const CompiledCheck check = check_compiled_program(steered_.model, compiled_nonfinite);
  capture.compiled_only = check.nonfinite;
  if (check.nonfinite && check.region) capture.compiled_region = check.region->module;
  return ", compiled re-run" +
         (check.region ? " and region search (" + std::to_string(check.region->runs + 1) + " runs)" : std::string()) +
         " " + seconds_text(check.seconds);
}

// The first birth's line. A re-run that raised says why ("the forensic
// re-run failed: RuntimeError: ...").
std::string Forensics::first_birth_text(const RunningStep& run, const format::Capture& capture,
                                        const std::optional<RanksBorn>& born, bool written_outside) const {
  if (capture.ops_seen < 0) return "the " + probe_.last_error();
  if (written_outside)
    return "none in this step: its buffers were already non-finite, written by " +
           std::to_string(run.calls_outside_losses) +
           " call(s) of the model that fed none of its losses (another model's phase, a logging call; train "
           "mode); re-run from the buffers before them, it is finite";
  const bool changed = changed_micro_batch(run) >= 0;
  if (!capture.first_birth && !capture.reproduced && changed)
    return "not reproduced on re-run, but" + changed_micro_batch_text(run);
  if (born && !capture.first_birth && !born->births.empty()) return born_elsewhere(born->births, born->birth);
  // A changed micro-batch matters to a re-run; weights that held the value had none.
  const bool rerun = capture.nonfinite_weights.empty();
  return format::capture_text(capture) + (changed && rerun ? "; but" + changed_micro_batch_text(run) : std::string());
}

// The snapshot of an investigated step, as the policy (and the ranks) decide:
// its path, or "".
std::string Forensics::keep_snapshot(const RunningStep& run, const std::optional<format::Capture>& capture,
                                     std::optional<RanksBorn>& born, const std::vector<float>& layer_grad_norm,
                                     bool written_outside) {
  const int64_t step = run.step;
  const SnapshotPolicy::Decision decision = snapshot_decision(run, *capture, born, written_outside);
  if (!decision.write) {
    journal_.event(step, format::EventKind::snapshot_skipped, decision.why_not);
    return "";
  }
  std::string path = write_snapshot(run, diagnosed_micro_batch(run, capture), layer_grad_norm, *capture,
                                    born ? std::move(born->gathered) : steered_.model.named_parameters());
  if (path.empty()) {
    journal_.event(step, format::EventKind::snapshot_failed, probe_.last_error());
    return "";
  }
  journal_.event(step, format::EventKind::snapshot, path);
  memory_.wrote_snapshot(path);
  return path;
}

// Which ranks found a birth and which write a snapshot, summed in one
// collective; when any writes one, every rank takes part in gathering the
// whole parameters (each holds a shard), and the writers keep them.
Forensics::RanksBorn Forensics::agree_on_births(GradientAverager& ranks, const std::optional<format::Capture>& capture,
                                                const RunningStep& run) {
  const int world = ranks.world_size(), rank = ranks.rank();
  const bool born_here = capture && capture->first_birth;
  at::Tensor flags = at::zeros({2 * world}, at::kFloat);
  flags[rank] = born_here ? 1.0f : 0.0f;
  RanksBorn out;
  // (A birth here means the buffers were not written outside the step.)
  if (born_here) out.decision = memory_.snapshot_decision(run.step, *capture);
  flags[world + rank] = out.decision && out.decision->write ? 1.0f : 0.0f;
  ranks.sum(flags);
  bool any_snapshot = false;
  for (int r = 0; r < world; ++r) {
    if (flags[r].item<float>() > 0) out.births.push_back(r);
    any_snapshot |= flags[world + r].item<float>() > 0;
  }
  out.birth = birth_from_rank(ranks, out.births, born_here ? format::capture_text(*capture) : std::string());
  if (any_snapshot) {
    NamedTensors whole = steered_.model.gathered_parameters();
    if (out.decision && out.decision->write) out.gathered = std::move(whole);
  }
  return out;
}

// Whether this step's snapshot is written, and if not why. In lockstep only a
// rank that found a birth writes one (its peers' re-runs were finite).
SnapshotPolicy::Decision Forensics::snapshot_decision(const RunningStep& run, const format::Capture& capture,
                                                      const std::optional<RanksBorn>& born, bool written_outside) {
  if (written_outside) return {false, "the step's fault was written outside it: nothing to replay"};
  if (born) {
    if (born->decision) return *born->decision;
    return {false, born->births.empty() ? "no rank found the birth" : "the snapshot is written where it was born"};
  }
  return memory_.snapshot_decision(run.step, capture);
}

namespace {

// Equal values, NaN where NaN and the same infinities: the same data.
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor x = a.to(b.device());
  return at::equal(at::isnan(x), at::isnan(b)) && at::equal(at::nan_to_num(x, 0.0), at::nan_to_num(b, 0.0));
}

}  // namespace

// The step before was skipped and this one's input is non-finite: most often
// state the loop carries across steps (an RNN's hidden state) that it took
// from the skipped step, or the same data again. Said once per run of such
// steps, naming the tensor.
void Forensics::say_carried_state(int64_t step, const std::vector<Batch>& micro_batches) {
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const std::vector<at::Tensor> tensors = micro_batches[k].tensors();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      if (!t.is_floating_point() || at::isfinite(t).all().item<bool>()) continue;
      std::ostringstream shape;
      shape << t.sizes();
      // The very tensor the skipped step had, its NaN/Inf where they were: a
      // data set reused every step (full-batch training, a cached tensor).
      const std::vector<at::Tensor> before =
          k < skipped_inputs_.size() ? skipped_inputs_[k].tensors() : std::vector<at::Tensor>{};
      if (i < before.size() && same_values(before[i], t)) {
        journal_.say(step, "the input holds the same NaN/Inf as the skipped step " + std::to_string(step - 1) +
                               "'s: tensor [" + std::to_string(i) + "] of micro-batch " + std::to_string(k) +
                               " (shape " + shape.str() +
                               ") is the same data again, reused every step (full-batch training, a cached "
                               "tensor), not state carried on: fix or drop its non-finite sample(s)");
        return;
      }
      journal_.say(step, "the input holds a NaN/Inf again after the skipped step " + std::to_string(step - 1) +
                             ": tensor [" + std::to_string(i) + "] of micro-batch " + std::to_string(k) + "'s " +
                             std::to_string(tensors.size()) + " (shape " + shape.str() +
                             ") is non-finite. State carried across steps (an RNN's hidden state) must not carry a "
                             "skipped step's on: restart it on a skip (if result.skipped: hidden = "
                             "model.init_hidden(batch_size)), or give back the one the skipped step began with");
      return;
    }
  }
}

int64_t Forensics::changed_micro_batch(const RunningStep& run) const {
  int64_t changed = -1;
  for (size_t k = 0; k < run.micro_batches.size(); ++k) {
    const MicroBatch& micro = run.micro_batches[k];
    if (micro.written == InPlaceWrite::none) continue;
    if (!std::isfinite(micro.recorded_loss)) return int64_t(k);  // the one whose loss went non-finite
    if (changed < 0) changed = int64_t(k);
  }
  return changed;
}

std::string Forensics::changed_micro_batch_text(const RunningStep& run) const {
  const int64_t k = changed_micro_batch(run);
  if (run.micro_batches.at(size_t(k)).written == InPlaceWrite::since_backward)
    return " the loop changed micro-batch " + std::to_string(k) +
           " in place after its backward, which it had not done before: the re-run saw the new values (the guard "
           "keeps a copy of each micro-batch from now on)";
  return " the loop changed micro-batch " + std::to_string(k) +
         " in place between its model call and backward: the re-run saw the new values (change a copy, or pass the "
         "batch: guard.backward(loss, batch))";
}

size_t Forensics::diagnosed_micro_batch(const RunningStep& run, const std::optional<format::Capture>& capture) const {
  if (capture && capture->first_birth && capture->first_birth->micro_batch >= 0)
    return size_t(capture->first_birth->micro_batch);
  const std::vector<float>& losses = run.outcome.micro_losses;
  for (size_t k = 0; k < losses.size(); ++k)
    if (!std::isfinite(losses[k])) return k;
  return 0;
}

// Everything needed to replay the step elsewhere (nanscope-replay), written
// before the fallback changes weights, optimizer state or precision.
std::string Forensics::write_snapshot(const RunningStep& run, size_t micro, const std::vector<float>& layer_grad_norm,
                                      const format::Capture& capture, NamedTensors parameters) {
  const int64_t step = run.step;
  const MicroBatch& kept = run.micro_batches.at(micro);
  probe::SnapshotContents s;
  s.step = step;
  const ModelSpec spec = steered_.model.spec();
  s.model_name = spec.name;
  s.model_hparams = spec.hparams;
  s.torchscript_bytes = spec.script_bytes;
  s.parameters = std::move(parameters);
  s.buffers = steered_.model.named_buffers();
  s.optimizer = options_.optimizer_name;
  s.optimizer_state = optimizer_state_by_name(steered_.optimizer, s.parameters);
  // A step of several micro-batches keeps the one its first birth was in, as
  // it was, with its RNG state and loss weight: what replay and the row
  // search re-run (never a regrouping of the step's rows).
  s.batch = kept.batch;
  const at::Tensor kept_rows = micro_batch_rows(run, micro);
  s.batch_rows = kept_rows.defined() ? kept_rows
                 : probe_.batch_rows().defined() && kept.batch.rows() == probe_.batch_rows().numel()
                     ? probe_.batch_rows()
                     : at::full({kept.batch.rows()}, -1, at::kLong);
  s.cpu_rng_state = (kept.cpu_rng_state.known() ? kept.cpu_rng_state : probe_.cpu_rng_state()).bytes();
  s.precision = run.amp;
  s.loss_scale = run.loss_scale_for_reruns();  // what its replay re-runs at
  s.lr = run.lr;
  s.clip = options_.clip;
  s.origin = options_.origin;
  s.config = recorded_config(options_);
  // The modules in fp32 at this step (planned or --fallback auto's): the replay keeps them so.
  s.config["fp32_modules"] = fp32_modules_flag_value(recovered_.fp32_modules());
  if (run.micro_batches.size() > 1) {
    s.config["micro_batch"] = std::to_string(micro);
    s.config["micro_batches"] = std::to_string(run.micro_batches.size());
  }
  if (std::isfinite(kept.recorded_loss)) s.config["recorded_loss"] = number_text(kept.recorded_loss);
  // A model of its own 16-bit weights: what its step computed in, for the viewer and report before any replay.
  if (std::string own = steered_.model.own_16bit_type_name(); !own.empty()) s.config["own_16bit"] = std::move(own);
  s.capture = capture;
  s.layer_names = probe_.layers().layer_names();
  s.layer_grad_norm = layer_grad_norm;
  std::string path = probe_.save_snapshot(s);
  // The other models the loss ran, as the step left them (each re-run put
  // their buffers back): what a replay runs that loss with.
  if (!path.empty() && !steered_.model.other_model_labels().empty()) {
    NamedTensors others = steered_.model.other_parameters();
    for (const auto& named : steered_.model.other_buffers()) others.push_back(named);
    probe::append_other_modules(path, others);
  }
  return path;
}

RemedyChoice Forensics::diagnose_in_lockstep(const RunningStep& run, const std::optional<format::Capture>& capture,
                                             bool needed) {
  GradientAverager& ranks = *run.context.averager;
  // The rank that found the birth leads; else one whose own loss went
  // non-finite; else any that re-ran the step (a fault seen by no op).
  const int claim = !needed || !capture ? 0 : capture->first_birth ? 3 : !run.outcome.local_loss_finite ? 2 : 1;
  const int leader = lockstep_leader(ranks, claim);
  if (leader < 0) {
    RemedyChoice none;
    none.no_say = true;
    return none;
  }
  return diagnose_led(run, capture, &ranks, leader);
}

namespace {

// The samples that trigger the cause, as fingerprints: the rows the cause
// names, or the row of the batch's own NaN/Inf; and their data set rows where
// `dataset_rows` (the step's, undefined when unknown) gives each of the
// batch's rows one.
RemedyChoice with_trigger_samples(RemedyChoice choice, const Batch& batch, const at::Tensor& dataset_rows) {
  if (!choice.cause) return choice;
  std::vector<int64_t> rows = choice.cause->rows;
  if (choice.cause->rule == CauseRule::nonfinite_batch) {
    const int64_t row = batch.first_nonfinite_row();
    if (row >= 0) rows.push_back(row);
  }
  const bool rows_known = dataset_rows.defined() && dataset_rows.numel() == batch.rows();
  const at::Tensor known = rows_known ? dataset_rows.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  for (int64_t row : rows) {
    choice.trigger_samples.push_back(batch.row_fingerprint(row));
    if (rows_known && row >= 0 && row < known.numel() && known.data_ptr<int64_t>()[row] >= 0)
      choice.trigger_dataset_rows.push_back(known.data_ptr<int64_t>()[row]);
  }
  return choice;
}

}  // namespace

RemedyChoice Forensics::diagnose(const RunningStep& run, const std::optional<format::Capture>& capture) {
  const AtFailedEvaluation trial_point(parameters_, run.evaluations);  // a closure optimizer's failed evaluation
  return diagnose_led(run, capture, nullptr, -1);
}

RemedyChoice Forensics::diagnose_led(const RunningStep& run, const std::optional<format::Capture>& capture,
                                     GradientAverager* lockstep, int leader) {
  FailedStep failed;
  failed.amp = run.amp;
  failed.own_16bit = steered_.model.own_16bit_type_name();
  // A NaN/Inf in a batch leaf the step never read is not the data's fault.
  failed.batch_finite = run.outcome.batch_finite || (capture && capture->batch_not_read);
  failed.capture = capture;
  // The unit a diagnosis re-runs: the micro-batch of the first birth (rows
  // are searched within it, never across micro-batches).
  const size_t diagnosed = diagnosed_micro_batch(run, capture);
  const MicroBatch& micro = run.micro_batches.at(diagnosed);
  failed.batch_size = steered_.runs_other_batches(run.watched) ? micro.batch.rows() : 0;
  failed.fp32_modules = recovered_.fp32_modules();
  failed.on_cpu = parameters_.empty() || parameters_.front().device().is_cpu();
  failed.kernels_tried =
      lockstep == nullptr && !steered_.model.compiled();  // a compiled model's kernels are its compiler's
  LiveStepReruns reruns(steered_.model, parameters_, run.loss_scale_for_reruns(), run.setup, micro);
  std::optional<ClosureModel::Step> with_loss_fn;
  steered_.run_other_batches_through_loss_fn(with_loss_fn, run.watched, micro.batch);
  const at::Tensor dataset_rows = micro_batch_rows(run, diagnosed);
  if (!lockstep) {
    RemedyChoice choice = choose_remedy(failed, reruns);
    // A TorchScript model opens no module scopes: a kernel pinned in its
    // module would never be entered, so the pin is the whole process's.
    if (choice.remedy == Remedy::kernel && steered_.model.is_torchscript()) choice.modules.clear();
    return with_trigger_samples(choice, micro.batch, dataset_rows);
  }
  if (lockstep->rank() != leader) {
    follow_lockstep_reruns(*lockstep, leader, reruns);
    RemedyChoice none;
    none.no_say = true;
    return none;
  }
  LockstepReruns leading(*lockstep, reruns);
  RemedyChoice choice;
  try {
    choice = choose_remedy(failed, leading);
  } catch (...) {
    leading.finish();  // the others stop following; the error is the leader's to report
    throw;
  }
  leading.finish();
  return with_trigger_samples(choice, micro.batch, dataset_rows);
}

}  // namespace nanscope
