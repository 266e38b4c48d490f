#include "nanscope/core/train_step.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <tuple>

#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/vocabulary.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/nvtx.hpp"
#include "nanscope/probe/torch_compat.hpp"

namespace nanscope {

at::ScalarType autocast_dtype(Amp amp) { return amp == Amp::fp16 ? at::kHalf : at::kBFloat16; }

at::Tensor forward_backward(TrainableModel& model, Amp amp, double loss_scale, const at::Tensor& inputs,
                            const at::Tensor& targets) {
  at::Tensor loss;
  {
    NANSCOPE_NVTX_RANGE("forward");
    // P4: autocast covers forward and loss only, never backward.
    compat::AutocastGuard autocast(inputs.device().type(), autocast_dtype(amp), amp != Amp::fp32);
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
  KeepBuffers buffers_as_found(model);
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
  probe::PhaseScope phase(format::Phase::grad_norm);
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

// Data parallel: one [3 x world + 2] flag vector rides with the gradient
// buckets (reduced with MAX): each rank's "gradients non-finite" and "loss
// non-finite" slots, one "stop" slot for Ctrl-C, each rank's loss (the others'
// slots hold -inf), and the batch's abs-max. Every rank then holds every
// verdict and loss, so all of them skip, warn and roll back alike. The global
// norm is taken over the averaged gradients. Still on the device: the host
// read comes after.
struct FlagLayout {
  int world;
  int grads(int r) const { return r; }
  int loss_bad(int r) const { return world + r; }
  int stop() const { return 2 * world; }
  int loss(int r) const { return 2 * world + 1 + r; }
  int absmax() const { return 3 * world + 1; }
  int size() const { return 3 * world + 2; }
};
struct AveragedGradients {
  at::Tensor flags, total_norm;
  std::vector<at::Tensor> norms;
  double seconds = 0;
};
AveragedGradients average_across_ranks(const StepSettings& settings, const std::vector<at::Tensor>& parameters,
                                       const at::Tensor& loss, const at::Tensor& found_inf,
                                       const at::Tensor& local_norm) {
  NANSCOPE_NVTX_RANGE("all_reduce");
  const FlagLayout at_{settings.buckets->world_size()};
  const int rank = settings.buckets->rank();
  AveragedGradients out;
  out.flags = at::zeros({at_.size()}, found_inf.options().dtype(at::kFloat));
  out.flags.narrow(0, at_.loss(0), at_.world).fill_(-std::numeric_limits<float>::infinity());
  if (settings.stop_requested) out.flags[at_.stop()].fill_(1);
  out.flags[at_.grads(rank)].copy_(((found_inf.reshape({}) > 0) | ~at::isfinite(local_norm)).to(at::kFloat));
  const at::Tensor l = loss.detach().reshape({}).to(at::kFloat);
  out.flags[at_.loss_bad(rank)].copy_((~at::isfinite(l)).to(at::kFloat));
  out.flags[at_.loss(rank)].copy_(l);
  if (settings.batch_absmax.defined()) out.flags[at_.absmax()].copy_(settings.batch_absmax.reshape({}));
  const auto start = std::chrono::steady_clock::now();
  settings.buckets->average(out.flags);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::tie(out.norms, out.total_norm) = grad_norms(defined_grads(parameters));
  return out;
}

// 1 when a buffer the forward wrote holds a non-finite value: the largest
// magnitude of each (NaN propagates through it), one foreach call.
// Undefined when there are none (no work, nothing added to the host read).
at::Tensor buffers_nonfinite(const std::vector<at::Tensor>* buffers, const at::Tensor& like) {
  if (!buffers || buffers->empty()) return {};
  std::vector<at::Tensor> largest = at::_foreach_norm(*buffers, std::numeric_limits<double>::infinity());
  for (at::Tensor& m : largest) m = m.to(like.device(), at::kFloat).reshape({1});
  return (~at::isfinite(at::cat(largest))).any().to(at::kFloat).reshape({1});
}

// Unscale, then the finiteness verdict and the norms, copied to the host once.
StepOutcome unscale_and_check(LossScaler& scaler, const std::vector<at::Tensor>& parameters,
                              const std::vector<at::Tensor>& grads, const StepSettings& settings,
                              const at::Tensor& loss) {
  NANSCOPE_NVTX_RANGE("unscale_and_check");
  // P7: unscale before anything reads the gradients.
  at::Tensor found_inf = scaler.enabled() ? scaler.unscale_(grads) : at::zeros({1}, loss.options().dtype(at::kFloat));
  auto [norms, local_norm] = grad_norms(grads);
  // Which parameters had a gradient here (the norms are theirs), taken before
  // averaging gives every parameter one.
  std::vector<bool> had_grad;
  if (settings.parameter_norms)
    for (const auto& p : parameters) had_grad.push_back(p.grad().defined());
  const at::Tensor buffers_bad = buffers_nonfinite(settings.written_buffers, found_inf.to(at::kFloat));
  AveragedGradients averaged;
  if (settings.buckets)
    averaged = average_across_ranks(settings, parameters, loss,
                                    buffers_bad.defined() ? found_inf + buffers_bad : found_inf, local_norm);
  const at::Tensor& total_norm = settings.buckets ? averaged.total_norm : local_norm;

  // The step's one host sync: loss, global norm, inf flag, batch flag, this
  // rank's norm and every rank's flags (several ranks), per-parameter norms.
  at::Tensor batch_flag =
      settings.batch_nonfinite.defined() ? settings.batch_nonfinite.reshape({1}) : at::zeros_like(found_inf);
  std::vector<at::Tensor> pack{loss.detach().to(at::kFloat).reshape({1}), total_norm.to(at::kFloat).reshape({1}),
                               found_inf.reshape({1}), batch_flag.to(found_inf.device(), at::kFloat),
                               local_norm.to(at::kFloat).reshape({1})};
  if (buffers_bad.defined()) pack.push_back(buffers_bad);
  if (settings.buckets) pack.push_back(averaged.flags);
  if (settings.batch_absmax.defined() && !settings.buckets)
    pack.push_back(settings.batch_absmax.reshape({1}).to(found_inf.device(), at::kFloat));
  if (settings.parameter_norms && !norms.empty()) pack.push_back(at::stack(norms).to(at::kFloat));
  const bool want_averaged = settings.parameter_norms && settings.averaged_parameter_norms && settings.buckets;
  if (want_averaged && !averaged.norms.empty()) pack.push_back(at::stack(averaged.norms).to(at::kFloat));
  at::Tensor host = at::cat(pack).to(at::kCPU);
  const float* h = host.data_ptr<float>();

  StepOutcome out;
  out.loss = h[0];
  out.grad_norm = h[1];
  out.batch_finite = h[3] == 0.0f;
  out.local_loss_finite = std::isfinite(h[0]);
  out.local_grads_finite = std::isfinite(h[4]) && h[2] == 0.0f;
  size_t next = 5;
  if (buffers_bad.defined()) out.buffers_finite = h[next++] == 0.0f;
  if (settings.buckets) {
    const FlagLayout at_{settings.buckets->world_size()};
    const float* flags = h + next;
    bool any_grads = false, any_loss = false;
    double loss_sum = 0;
    for (int r = 0; r < at_.world; ++r) {
      const bool grads_bad = flags[at_.grads(r)] != 0.0f, loss_bad = flags[at_.loss_bad(r)] != 0.0f;
      if (grads_bad || loss_bad) out.nonfinite_ranks.push_back(r);
      any_grads |= grads_bad;
      any_loss |= loss_bad;
      loss_sum += flags[at_.loss(r)];
    }
    out.stop_requested = flags[at_.stop()] != 0.0f;
    out.global_loss = any_loss ? std::numeric_limits<double>::quiet_NaN() : loss_sum / at_.world;
    if (settings.batch_absmax.defined()) out.batch_absmax = flags[at_.absmax()];
    next += at_.size();
    out.loss_finite = !any_loss;
    out.grads_finite = !any_grads && std::isfinite(h[1]);
    out.allreduce_seconds = averaged.seconds;
  } else {
    out.global_loss = out.loss;
    out.loss_finite = out.local_loss_finite;
    out.grads_finite = out.local_grads_finite && std::isfinite(h[1]);
    if (!out.finite()) out.nonfinite_ranks.push_back(0);
    if (settings.batch_absmax.defined()) out.batch_absmax = h[next++];
  }
  if (settings.parameter_norms) {
    // Parameters without a gradient (unused this step) read as 0.
    out.parameter_norms.assign(parameters.size(), 0.0f);
    for (size_t i = 0; i < parameters.size(); ++i)
      if (had_grad[i]) out.parameter_norms[i] = h[next++];
    // After averaging every parameter has a gradient.
    if (want_averaged && averaged.norms.size() == parameters.size())
      out.global_parameter_norms.assign(h + next, h + next + averaged.norms.size());
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
  if (settings.buckets) grads = defined_grads(parameters);  // averaging defined the unused ones
  out.skipped_as_spike = out.finite() && out.global_loss > settings.skip_loss_above;
  if (!out.finite() || out.skipped_as_spike) {
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
