#include "trainer.hpp"

#include <csignal>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include <torch/version.h>

#include "checkpoint.hpp"
#include "nanscope/probe/error_text.hpp"
#include "distributed.hpp"
#include "nanscope/core/fallback.hpp"
#include "gradient_buckets.hpp"
#include "forensics.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/probe/activation_recorder.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/probe.hpp"
#include "nanscope/core/optimizer.hpp"
#include "progress.hpp"
#include "schedule.hpp"
#include "setup.hpp"
#include "snapshot_policy.hpp"
#include "nanscope/core/train_step.hpp"

namespace nanscope {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

format::AmpMode amp_mode(Amp amp) {
  switch (amp) {
    case Amp::bf16: return format::AmpMode::bf16;
    case Amp::fp16: return format::AmpMode::fp16;
    default: return format::AmpMode::fp32;
  }
}


std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::map<std::string, std::string> run_config(const TrainOptions& o, const std::vector<Fault>& planted,
                                              const Dataset& data, at::Device device,
                                              const TrainableModel& model) {
  std::string faults;
  for (const auto& f : planted)
    faults += (faults.empty() ? "" : ",") + std::string(fault_name(f.kind)) + "@" +
              std::to_string(f.step) + ":" + fmt(f.arg);
  return {{"model", o.model},          {"data", data.source},
          {"init", o.init},            {"steps", std::to_string(o.steps)},
          {"batch_size", std::to_string(o.batch_size)}, {"lr", fmt(o.lr)},
          {"optimizer", o.optimizer},  {"weight_decay", fmt(o.weight_decay)},
          {"schedule", o.schedule},    {"warmup", std::to_string(o.warmup)},
          {"clip", fmt(o.clip)},       {"amp", amp_name(o.amp)},
          {"lr_backoff", fmt(o.lr_backoff)}, {"fallback", o.fallback ? "on" : "off"},
          {"z_loss", fmt(o.z_loss)},   {"shuffle", o.shuffle ? "on" : "off"},
          {"probe", o.probe ? "on" : "off"}, {"seed", std::to_string(o.seed)},
          {"capture", o.capture_every_step ? "every-step" : "on-failure"},
          {"act_absmax_every", std::to_string(o.act_absmax_every)},
          {"max_snapshots", std::to_string(o.max_snapshots)},
          {"device", device.str()},    {"faults", faults},
          {"torch_version", TORCH_VERSION}, {"parameters", std::to_string(model.parameter_count())},
          {"rank", std::to_string(o.dist.rank)}, {"world_size", std::to_string(o.dist.world_size)}};
}

// The outcome of a step whose forward or backward raised: nothing finite came
// of it, so it is skipped like a non-finite loss (gradients dropped, the fp16
// scale backs off).
StepOutcome raised_step_outcome(LossScaler& scaler, const std::vector<at::Tensor>& parameters) {
  clear_grads(parameters);
  StepOutcome out;
  out.loss = std::numeric_limits<double>::quiet_NaN();
  out.grad_norm = std::numeric_limits<double>::quiet_NaN();
  out.loss_finite = out.local_loss_finite = false;
  out.skipped = true;
  out.nonfinite_ranks = {0};
  scaler.update(true);
  return out;
}

// --save with several ranks: rank 0 writes it (the weights are the same on
// every rank), unless the path names "{rank}", which each rank fills in.
std::string checkpoint_path_for_rank(const std::string& path, const DistOptions& d) {
  const auto at = path.find("{rank}");
  if (at != std::string::npos) return std::string(path).replace(at, 6, std::to_string(d.rank));
  return d.rank == 0 ? path : "";
}

}  // namespace

TrainSummary run(const TrainOptions& o, std::ostream& log) {
  const DistOptions& dist = o.dist;
  at::Device device = select_device(o.device);
  if (dist.enabled() && device.is_cuda()) device = at::Device(at::kCUDA, dist.local_rank);
  configure_runtime(o, device);
  const std::vector<Fault> faults = faults_on_rank(o.faults, dist.rank);
  const std::string who = dist.enabled() ? "[rank " + std::to_string(dist.rank) + "] " : "";
  Dataset data = make_dataset(o);
  std::unique_ptr<TrainableModel> model = make_model(o, data);
  if (!o.init.empty()) {
    const int64_t from = load_checkpoint(o.init, *model);
    log << "init: " << o.init << " (saved at step " << from << ")\n";
  }
  check_compatibility(o, *model, data, device);
  model->to(device, at::kFloat);
  model->set_training(true);
  model->set_z_loss(o.z_loss);

  NamedTensors named = model->named_parameters();
  std::vector<at::Tensor> parameters;
  std::vector<std::string> parameter_names;
  for (const auto& [name, p] : named)
    if (p.requires_grad()) {
      parameters.push_back(p);
      parameter_names.push_back(name);
    }
  if (parameters.empty()) throw std::invalid_argument("the model has no trainable parameters");
  // Data parallel: rendezvous, every rank starts from rank 0's weights, and
  // the gradient buckets are laid out once.
  std::unique_ptr<ProcessGroup> group;
  std::optional<GradientBuckets> buckets;
  if (dist.enabled()) {
    group = ProcessGroup::connect(dist, device);
    group->set_context("start: weights from rank 0");
    std::vector<at::Tensor> state;
    for (auto& [name, t] : named) state.push_back(t.detach());
    for (auto& [name, t] : model->named_buffers()) state.push_back(t);
    group->broadcast(state);
    buckets.emplace(*group, parameters, dist.bucket_mb);
  }
  auto optimizer = make_optimizer(o.optimizer, parameters, o.lr, o.weight_decay);
  LossScalerConfig scaler_config;
  scaler_config.enabled = o.amp == Amp::fp16;
  LossScaler scaler(scaler_config);
  probe::ProbeOptions probe_options;
  probe_options.run_dir = o.run_dir;
  probe_options.rank = dist.rank;
  probe_options.world_size = dist.world_size;
  probe::Probe probe(probe_options, parameter_names);
  // Each rank reads its own shard: rows [rank*B, (rank+1)*B) of every global batch.
  BatchSampler sampler(data.size(), o.batch_size, o.shuffle, o.seed, dist.rank, dist.world_size);

  std::filesystem::create_directories(o.run_dir);
  format::RunHeader header;
  if (o.probe) header.layer_names = probe.layers().layer_names();
  header.record_act_absmax = o.act_absmax_every > 0;
  header.config = run_config(o, faults, data, device, *model);
  format::RunWriter writer(
      (std::filesystem::path(o.run_dir) / format::run_file_name(dist.rank, dist.world_size)).string(), header);

  log << who << "nanscope-train: " << o.model << " (" << model->parameter_count() << " parameters) on "
      << data.source << " (" << data.size() << " samples), " << o.steps << " steps, amp "
      << amp_name(o.amp) << ", device " << device.str() << ", LibTorch " << TORCH_VERSION;
  if (group)
    log << ", rank " << dist.rank << " of " << dist.world_size << " (c10d " << group->backend() << ", "
        << buckets->bucket_count() << " gradient bucket(s))";
  log << "\n";

  g_interrupted = false;
  auto previous_handler = std::signal(SIGINT, on_interrupt);
  Amp amp = o.amp;
  FallbackPolicy fallback(o.fallback, o.lr_backoff, o.fallback_min_scale);
  SnapshotPolicy snapshots(o.max_snapshots);
  TrainSummary summary;
  summary.run_file = writer.path();
  std::vector<double> step_times, allreduce_times;
  ProgressLine progress(log, o.log_every, o.quiet || dist.rank != 0);
  const auto run_start = std::chrono::steady_clock::now();
  bool stop = false;

  for (int64_t step = 0; step < o.steps && !stop; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double lr = scheduled_lr(o.schedule, o.lr, o.warmup, o.steps, step) * fallback.lr_multiplier() *
                      lr_multiplier_at(faults, step);
    set_lr(*optimizer, lr);
    at::Tensor rows = sampler.rows(step);
    at::Tensor inputs = data.inputs.index_select(0, rows);
    if (auto row = poisoned_row_at(faults, step)) inputs[*row].fill_(std::nan(""));
    inputs = inputs.to(device);
    at::Tensor targets = data.targets.index_select(0, rows).to(device);

    model->plant_fault(model_fault_at(faults, step));
    const double scale_before = scaler.scale();
    StepSettings settings{amp, o.clip, o.probe, {}};
    if (buckets) {
      settings.buckets = &*buckets;
      settings.stop_requested = g_interrupted;
      group->set_context("step " + std::to_string(step));
    }
    if (o.probe) {
      probe.begin_step(step, rows);
      settings.batch_nonfinite = probe.batch_nonfinite(inputs);
    }
    StepOutcome outcome;
    std::string step_error;  // the model raised during the step
    std::vector<float> act_absmax;
    try {
      // --capture every-step: op-level capture on the live step (costly; for
      // hunting or measuring), instead of only on the forensic re-run.
      std::optional<probe::OpCapture> live_capture;
      if (o.capture_every_step) live_capture.emplace();
      std::optional<probe::ActivationRecorder> activations;
      if (o.probe && o.act_absmax_every > 0 && step % o.act_absmax_every == 0)
        activations.emplace(probe.layers().layer_names());
      outcome = train_step(*model, *optimizer, scaler, parameters, settings, inputs, targets);
      if (activations) act_absmax = activations->result();
    } catch (const DistributedError& e) {
      // A peer is gone: say so in this rank's run file, which stays whole.
      writer.event({step, format::kEventDistError, e.what()});
      writer.flush();
      throw;
    } catch (const std::exception& e) {
      // An op that raised on a NaN (binary_cross_entropy checks its input) is
      // a non-finite step if the forensic re-run finds a birth before it;
      // otherwise (or with no probe to look, or peers waiting in a collective)
      // it is an error in the model and the run fails.
      if (!o.probe || buckets) throw;
      step_error = probe::one_line_error(e);
      outcome = raised_step_outcome(scaler, parameters);
    }
    model->plant_fault({FaultKind::none});
    const double step_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stop = buckets ? outcome.stop_requested : g_interrupted.load();

    format::StepRow row;
    row.step = step;
    row.loss = outcome.loss;
    row.lr = lr;
    row.loss_scale = scale_before;
    row.grad_norm = outcome.grad_norm;
    row.skipped = outcome.skipped;
    row.amp = amp_mode(amp);
    row.step_time = step_time;
    if (o.probe) row.layer_grad_norm = probe.layer_grad_norms(outcome.parameter_norms);
    row.layer_act_absmax = std::move(act_absmax);
    writer.append(row);
    step_times.push_back(step_time);
    if (buckets) allreduce_times.push_back(outcome.allreduce_seconds);
    summary.steps_run = step + 1;

    if (outcome.finite()) {
      summary.last_finite_loss = outcome.loss;
      summary.last_finite_step = step;
    } else {
      ++summary.skipped;
      const std::string where = buckets ? " on rank(s) " + format::rank_list_text(outcome.nonfinite_ranks) : "";
      writer.event({step, "skip",
                    std::string(outcome.loss_finite ? "non-finite gradients" : "non-finite loss") + where +
                        " at " + precision_name(amp) + "; optimizer step skipped" +
                        (step_error.empty() ? "" : " (the model raised: " + step_error + ")")});
      if (buckets) {
        // Every rank records who went non-finite; the first time, as the run's first.
        const std::string ranks = format::rank_list_text(outcome.nonfinite_ranks);
        if (summary.first_nonfinite_ranks.empty() && !outcome.nonfinite_ranks.empty()) {
          summary.first_nonfinite_ranks = outcome.nonfinite_ranks;
          writer.event({step, format::kEventFirstNonfinite, ranks});
        }
        writer.event({step, format::kEventNonfiniteRanks, ranks});
      }
      if (scaler.enabled())
        writer.event({step, "scale_backoff", "loss scale " + fmt(scale_before) + " -> " + fmt(scaler.scale())});
      // Forensics where the fault is: a rank whose own check failed re-runs
      // its own batch. If none did (only the averaged gradients overflowed),
      // rank 0 looks.
      const bool investigate =
          !outcome.locally_finite() || (outcome.nonfinite_ranks.empty() && dist.rank == 0);
      if (o.probe && investigate) {
        FailedStep failed{step, amp, scale_before, lr, inputs, targets, row.layer_grad_norm};
        const format::Capture capture = rerun_under_capture(probe, *model, parameters, faults, failed);
        if (!step_error.empty() && !capture.first_birth) {
          writer.flush();
          throw std::runtime_error("step " + std::to_string(step) + ": " + step_error);
        }
        const std::string birth = describe_birth(capture);
        log << who << "step " << step << ": first birth: " << birth << "\n";
        writer.event({step, "first_birth", birth});
        const SnapshotPolicy::Decision decision = snapshots.decide(step, capture);
        if (!decision.write) {
          writer.event({step, format::kEventSnapshotSkipped, decision.why_not});
        } else if (std::string path =
                       write_failed_step_snapshot(probe, *model, *optimizer, o, header.config, failed, capture);
                   !path.empty()) {
          writer.event({step, "snapshot", path});
          summary.snapshots.push_back(path);
        } else {
          writer.event({step, "snapshot_failed", probe.last_error()});
        }
      }
      if (fallback.should_fire(amp, outcome, scaler)) {
        fallback.fire(*model, *optimizer, scaler, device, step);
        summary.fallback_step = step;
        writer.event({step, "fallback", std::string(precision_name(amp)) + " -> fp32, LR x " + fmt(o.lr_backoff)});
        log << who << "step " << step << ": non-finite " << (outcome.loss_finite ? "gradients" : "loss") << where
            << " at " << precision_name(amp) << " -> skipped; fallback to fp32, LR x " << o.lr_backoff << "\n";
        amp = Amp::off;
      } else {
        log << who << "step " << step << ": non-finite " << (outcome.loss_finite ? "gradients" : "loss") << where
            << " -> skipped" << (scaler.enabled() ? ", loss scale " + fmt(scaler.scale()) : "") << "\n";
      }
      writer.flush();  // a skip is exactly what a post-mortem wants on disk
    }
    summary.final_lr = lr;
    summary.final_loss_scale = scaler.scale();
    progress.update({step, o.steps, summary.skipped, outcome.loss, !outcome.finite(), summary.last_finite_loss,
                     summary.last_finite_step, scaler.scale(), outcome.grad_norm, precision_name(amp)});
    if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) {
      const std::string path = checkpoint_path_for_rank(o.save, dist);
      if (!path.empty()) save_checkpoint(path, *model, step + 1);
    }
  }
  std::signal(SIGINT, previous_handler);
  summary.interrupted = stop;
  writer.flush();
  if (!o.save.empty()) {
    const std::string path = checkpoint_path_for_rank(o.save, dist);
    if (!path.empty()) save_checkpoint(path, *model, summary.steps_run);
  }
  if (group) {
    group->set_context("end of run");
    group->barrier();  // no rank tears its connections down while a peer still reads
  }

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  summary.steps_per_second = total > 0 ? double(summary.steps_run) / total : 0;
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + step_times.size() / 2, step_times.end());
    summary.median_step_time = step_times[step_times.size() / 2];
  }
  if (!allreduce_times.empty()) {
    std::nth_element(allreduce_times.begin(), allreduce_times.begin() + allreduce_times.size() / 2,
                     allreduce_times.end());
    summary.median_allreduce_time = allreduce_times[allreduce_times.size() / 2];
    summary.world_size = dist.world_size;
  }
  return summary;
}

void print_summary(const TrainSummary& s, std::ostream& out) {
  out << "summary: " << s.steps_run << " steps" << (s.interrupted ? " (interrupted)" : "") << ", "
      << s.skipped << " skipped, fallback "
      << (s.fallback_step >= 0 ? "at step " + std::to_string(s.fallback_step) : std::string("not needed"))
      << ", " << (s.last_finite_step < 0 ? std::string("no finite loss")
                                         : "last finite loss " + fmt(s.last_finite_loss) + " (step " +
                                               std::to_string(s.last_finite_step) + ")")
      << ", lr " << s.final_lr << ", loss scale " << s.final_loss_scale
      << ", " << s.steps_per_second << " steps/s (median step " << s.median_step_time * 1e3 << " ms)\n";
  if (s.world_size > 1)
    out << "ranks: " << s.world_size << ", median all-reduce " << s.median_allreduce_time * 1e3 << " ms ("
        << (s.median_step_time > 0 ? 100.0 * s.median_allreduce_time / s.median_step_time : 0.0)
        << "% of the median step)"
        << (s.first_nonfinite_ranks.empty()
                ? ""
                : ", first non-finite rank(s) " + format::rank_list_text(s.first_nonfinite_ranks))
        << "\n";
  out
      << "run file: " << s.run_file << "\n";
}

}  // namespace nanscope
