#include "forensics.hpp"

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

namespace {


}  // namespace

format::Capture rerun_under_capture(probe::Probe& probe, TrainableModel& model,
                                    const std::vector<at::Tensor>& parameters, const std::vector<Fault>& faults,
                                    const FailedStep& failed) {
  auto rerun = [&] {
    recompute_step(model, parameters, failed.amp, failed.loss_scale, model_fault_at(faults, failed.step),
                   failed.inputs, failed.targets);
  };
  format::Capture capture = probe.investigate(rerun, failed.inputs);
  clear_grads(parameters);
  return capture;
}

std::string write_failed_step_snapshot(probe::Probe& probe, TrainableModel& model,
                                       torch::optim::Optimizer& optimizer, const TrainOptions& options,
                                       const std::map<std::string, std::string>& config,
                                       const FailedStep& failed, const format::Capture& capture) {
  probe::SnapshotContents s;
  s.step = failed.step;
  const ModelSpec spec = model.spec();
  s.model_name = spec.name;
  s.model_hparams = spec.hparams;
  s.torchscript_bytes = spec.script_bytes;
  s.parameters = model.named_parameters();
  s.buffers = model.named_buffers();
  s.optimizer = options.optimizer;
  s.optimizer_state = optimizer_state_by_name(optimizer, s.parameters);
  s.inputs = failed.inputs;
  s.targets = failed.targets;
  s.batch_rows = probe.batch_rows();
  s.cpu_rng_state = probe.cpu_rng_state();
  s.precision = precision_name(failed.amp);
  s.loss_scale = failed.loss_scale;
  s.lr = failed.lr;
  s.clip = options.clip;
  s.config = config;
  s.capture = capture;
  s.layer_names = probe.layers().layer_names();
  s.layer_grad_norm = failed.layer_grad_norm;
  return probe.save_snapshot(s);
}

std::string describe_birth(const format::Capture& c) {
  if (c.ops_seen < 0) return "the forensic re-run failed";
  if (!c.first_birth) return "not reproduced on re-run (transient)";
  const format::Birth& b = *c.first_birth;
  std::string text = b.kind + " at " + b.op.op + " (" + b.op.phase;
  if (!b.op.backward_node.empty()) text += " in " + b.op.backward_node + " of " + b.op.forward_op;
  text += ") in module '" + b.op.module + "'";
  if (b.sample >= 0) text += ", sample " + std::to_string(b.sample);
  return text;
}

}  // namespace nanscope
