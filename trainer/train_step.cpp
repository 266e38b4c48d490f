#include "train_step.hpp"

#include <cmath>

#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/nvtx.hpp"
#include "optimizer.hpp"
#include "nanscope/probe/torch_compat.hpp"

namespace nanscope {

at::ScalarType autocast_dtype(Amp amp) { return amp == Amp::fp16 ? at::kHalf : at::kBFloat16; }

at::Tensor forward_backward(TrainableModel& model, Amp amp, double loss_scale, const at::Tensor& inputs,
                            const at::Tensor& targets) {
  at::Tensor loss;
  {
    NANSCOPE_NVTX_RANGE("forward");
    // P4: autocast covers forward and loss only, never backward.
    compat::AutocastGuard autocast(inputs.device().type(), autocast_dtype(amp), amp != Amp::off);
    loss = model.loss(inputs, targets);
  }
  NANSCOPE_NVTX_RANGE("backward");
  (loss_scale != 1.0 ? loss * loss_scale : loss).backward();
  return loss;
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  grads.reserve(parameters.size());
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

std::pair<std::vector<at::Tensor>, at::Tensor> grad_norms(const std::vector<at::Tensor>& grads) {
  if (grads.empty()) return {{}, at::zeros({})};
  std::vector<at::Tensor> norms = at::_foreach_norm(grads);
  at::Tensor total = at::stack(norms).norm();
  return {std::move(norms), std::move(total)};
}

StepRecomputation recompute_step(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp,
                                 double loss_scale, const Fault& fault, const at::Tensor& inputs,
                                 const at::Tensor& targets) {
  clear_grads(parameters);
  model.plant_fault(fault);
  StepRecomputation out;
  try {
    out.loss = forward_backward(model, amp, loss_scale, inputs, targets);
  } catch (...) {
    model.plant_fault({});
    throw;
  }
  model.plant_fault({});
  // Finite gradients whose norm overflows are a non-finite step too (P18).
  probe::PhaseScope phase("grad_norm");
  std::vector<at::Tensor> grads = defined_grads(parameters);
  LossScalerConfig same_scale;
  same_scale.enabled = loss_scale != 1.0;
  same_scale.init_scale = loss_scale;
  out.found_inf = same_scale.enabled ? LossScaler(same_scale).unscale_(grads) : at::zeros({1});
  out.total_norm = grad_norms(grads).second;
  return out;
}

bool StepRecomputation::finite() const {
  return std::isfinite(loss.item<double>()) && std::isfinite(total_norm.item<double>()) &&
         found_inf.item<float>() == 0.0f;
}

namespace {

// Unscale, then the finiteness verdict and the norms, copied to the host once.
StepOutcome unscale_and_check(LossScaler& scaler, const std::vector<at::Tensor>& parameters,
                              const std::vector<at::Tensor>& grads, const StepSettings& settings,
                              const at::Tensor& loss) {
  NANSCOPE_NVTX_RANGE("unscale_and_check");
  // P7: unscale before anything reads the gradients.
  at::Tensor found_inf = scaler.enabled() ? scaler.unscale_(grads) : at::zeros({1}, loss.options().dtype(at::kFloat));
  auto [norms, total_norm] = grad_norms(grads);

  // The step's one host sync: loss, global norm, inf flag, batch flag (and
  // per-parameter norms).
  at::Tensor batch_flag = settings.batch_nonfinite.defined() ? settings.batch_nonfinite.reshape({1})
                                                             : at::zeros_like(found_inf);
  std::vector<at::Tensor> pack{loss.detach().to(at::kFloat).reshape({1}),
                               total_norm.to(at::kFloat).reshape({1}), found_inf.reshape({1}),
                               batch_flag.to(found_inf.device(), at::kFloat)};
  if (settings.parameter_norms && !norms.empty()) pack.push_back(at::stack(norms).to(at::kFloat));
  at::Tensor host = at::cat(pack).to(at::kCPU);
  const float* h = host.data_ptr<float>();

  StepOutcome out;
  out.loss = h[0];
  out.grad_norm = h[1];
  out.loss_finite = std::isfinite(h[0]);
  out.grads_finite = std::isfinite(h[1]) && h[2] == 0.0f;
  out.batch_finite = h[3] == 0.0f;
  if (settings.parameter_norms) {
    // Parameters without a gradient (unused this step) read as 0.
    out.parameter_norms.assign(parameters.size(), 0.0f);
    size_t g = 0;
    for (size_t i = 0; i < parameters.size(); ++i)
      if (parameters[i].grad().defined()) out.parameter_norms[i] = h[4 + g++];
  }
  return out;
}

}  // namespace

StepOutcome train_step(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                       const std::vector<at::Tensor>& parameters, const StepSettings& settings,
                       const at::Tensor& inputs, const at::Tensor& targets) {
  clear_grads(parameters);
  at::Tensor loss = forward_backward(model, settings.amp, scaler.scale(), inputs, targets);
  std::vector<at::Tensor> grads = defined_grads(parameters);

  StepOutcome out = unscale_and_check(scaler, parameters, grads, settings, loss);
  if (!out.finite()) {
    // P14: skip the batch. Gradients go; weights and optimizer state are untouched.
    clear_grads(parameters);
    out.skipped = true;
  } else {
    NANSCOPE_NVTX_RANGE("optimizer");
    if (settings.clip > 0 && out.grad_norm > settings.clip)
      at::_foreach_mul_(grads, settings.clip / (out.grad_norm + 1e-6));
    optimizer.step();
  }
  scaler.update(!out.finite());
  return out;
}

}  // namespace nanscope
