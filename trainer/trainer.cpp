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
#include "fallback.hpp"
#include "forensics.hpp"
#include "loss_scaler.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/activation_recorder.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/probe.hpp"
#include "optimizer.hpp"
#include "progress.hpp"
#include "schedule.hpp"
#include "setup.hpp"
#include "train_step.hpp"

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

const char* precision_name(Amp amp) { return amp == Amp::off ? "fp32" : amp_name(amp); }

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::map<std::string, std::string> run_config(const TrainOptions& o, const Dataset& data,
                                              at::Device device, const TrainableModel& model) {
  std::string faults;
  for (const auto& f : o.faults)
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
          {"device", device.str()},    {"faults", faults},
          {"torch_version", TORCH_VERSION}, {"parameters", std::to_string(model.parameter_count())}};
}

}  // namespace

TrainSummary run(const TrainOptions& o, std::ostream& log) {
  const at::Device device = select_device(o.device);
  configure_runtime(o, device);
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
  auto optimizer = make_optimizer(o.optimizer, parameters, o.lr, o.weight_decay);
  LossScalerConfig scaler_config;
  scaler_config.enabled = o.amp == Amp::fp16;
  LossScaler scaler(scaler_config);
  probe::Probe probe({o.run_dir, {}}, parameter_names);
  BatchSampler sampler(data.size(), o.batch_size, o.shuffle, o.seed);

  std::filesystem::create_directories(o.run_dir);
  format::RunHeader header;
  if (o.probe) header.layer_names = probe.layers().layer_names();
  header.record_act_absmax = o.act_absmax_every > 0;
  header.config = run_config(o, data, device, *model);
  format::RunWriter writer((std::filesystem::path(o.run_dir) / "run.h5").string(), header);

  log << "nanscope-train: " << o.model << " (" << model->parameter_count() << " parameters) on "
      << data.source << " (" << data.size() << " samples), " << o.steps << " steps, amp "
      << amp_name(o.amp) << ", device " << device.str() << ", LibTorch " << TORCH_VERSION << "\n";

  g_interrupted = false;
  auto previous_handler = std::signal(SIGINT, on_interrupt);
  Amp amp = o.amp;
  FallbackPolicy fallback(o.fallback, o.lr_backoff, o.fallback_min_scale);
  TrainSummary summary;
  summary.run_file = writer.path();
  summary.final_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> step_times;
  ProgressLine progress(log, o.log_every, o.quiet);
  const auto run_start = std::chrono::steady_clock::now();

  for (int64_t step = 0; step < o.steps && !g_interrupted; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const double lr = scheduled_lr(o.schedule, o.lr, o.warmup, o.steps, step) * fallback.lr_multiplier() *
                      lr_multiplier_at(o.faults, step);
    set_lr(*optimizer, lr);
    at::Tensor rows = sampler.rows(step);
    at::Tensor inputs = data.inputs.index_select(0, rows);
    if (auto row = poisoned_row_at(o.faults, step)) inputs[*row].fill_(std::nan(""));
    inputs = inputs.to(device);
    at::Tensor targets = data.targets.index_select(0, rows).to(device);

    model->plant_fault(model_fault_at(o.faults, step));
    const double scale_before = scaler.scale();
    StepSettings settings{amp, o.clip, o.probe, {}};
    if (o.probe) {
      probe.begin_step(step, rows);
      settings.batch_nonfinite = probe.batch_nonfinite(inputs);
    }
    StepOutcome outcome;
    std::vector<float> act_absmax;
    {
      // --capture every-step: op-level capture on the live step (costly; for
      // hunting or measuring), instead of only on the forensic re-run.
      std::optional<probe::OpCapture> live_capture;
      if (o.capture_every_step) live_capture.emplace();
      std::optional<probe::ActivationRecorder> activations;
      if (o.probe && o.act_absmax_every > 0 && step % o.act_absmax_every == 0)
        activations.emplace(probe.layers().layer_names());
      outcome = train_step(*model, *optimizer, scaler, parameters, settings, inputs, targets);
      if (activations) act_absmax = activations->result();
    }
    model->plant_fault({FaultKind::none});
    const double step_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

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
    summary.steps_run = step + 1;

    if (outcome.finite()) {
      summary.final_loss = outcome.loss;
    } else {
      ++summary.skipped;
      writer.event({step, "skip",
                    std::string(outcome.loss_finite ? "non-finite gradients" : "non-finite loss") +
                        " at " + precision_name(amp) + "; optimizer step skipped"});
      if (scaler.enabled())
        writer.event({step, "scale_backoff", "loss scale " + fmt(scale_before) + " -> " + fmt(scaler.scale())});
      if (o.probe) {
        FailedStep failed{step, amp, scale_before, lr, inputs, targets, row.layer_grad_norm};
        ForensicsResult found = investigate_failed_step(probe, *model, *optimizer, parameters, o.faults, o,
                                                        header.config, failed);
        const std::string birth = describe_birth(found.capture);
        log << "step " << step << ": first birth: " << birth << "\n";
        writer.event({step, "first_birth", birth});
        if (!found.snapshot_path.empty()) {
          writer.event({step, "snapshot", found.snapshot_path});
          summary.snapshots.push_back(found.snapshot_path);
        } else {
          writer.event({step, "snapshot_failed", probe.last_error()});
        }
      }
      if (fallback.should_fire(amp, outcome, scaler)) {
        fallback.fire(*model, *optimizer, scaler, device, step);
        summary.fallback_step = step;
        writer.event({step, "fallback", std::string(precision_name(amp)) + " -> fp32, LR x " + fmt(o.lr_backoff)});
        log << "step " << step << ": non-finite " << (outcome.loss_finite ? "gradients" : "loss")
            << " at " << precision_name(amp) << " -> skipped; fallback to fp32, LR x " << o.lr_backoff << "\n";
        amp = Amp::off;
      } else {
        log << "step " << step << ": non-finite " << (outcome.loss_finite ? "gradients" : "loss")
            << " -> skipped" << (scaler.enabled() ? ", loss scale " + fmt(scaler.scale()) : "") << "\n";
      }
      writer.flush();  // a skip is exactly what a post-mortem wants on disk
    }
    summary.final_lr = lr;
    summary.final_loss_scale = scaler.scale();
    progress.update({step, o.steps, summary.skipped, outcome.loss, scaler.scale(), outcome.grad_norm,
                     precision_name(amp)});
    if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0)
      save_checkpoint(o.save, *model, step + 1);
  }
  std::signal(SIGINT, previous_handler);
  summary.interrupted = g_interrupted;
  writer.flush();
  if (!o.save.empty()) save_checkpoint(o.save, *model, summary.steps_run);

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  summary.steps_per_second = total > 0 ? double(summary.steps_run) / total : 0;
  if (!step_times.empty()) {
    std::nth_element(step_times.begin(), step_times.begin() + step_times.size() / 2, step_times.end());
    summary.median_step_time = step_times[step_times.size() / 2];
  }
  return summary;
}

void print_summary(const TrainSummary& s, std::ostream& out) {
  out << "summary: " << s.steps_run << " steps" << (s.interrupted ? " (interrupted)" : "") << ", "
      << s.skipped << " skipped, fallback "
      << (s.fallback_step >= 0 ? "at step " + std::to_string(s.fallback_step) : std::string("not needed"))
      << ", final loss " << s.final_loss << ", lr " << s.final_lr << ", loss scale " << s.final_loss_scale
      << ", " << s.steps_per_second << " steps/s (median step " << s.median_step_time * 1e3 << " ms)\n"
      << "run file: " << s.run_file << "\n";
}

}  // namespace nanscope
