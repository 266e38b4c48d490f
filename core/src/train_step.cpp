#include "nanscope/core/train_step.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/vocabulary.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/nvtx.hpp"

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
  plant_fault(model, fault);
  StepRecomputation out;
  try {
    out.loss = forward_backward(model, amp, loss_scale, inputs, targets);
  } catch (...) {
    plant_fault(model, {});
    throw;
  }
  plant_fault(model, {});
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

// 1 when the forward left a value of a buffer it wrote non-finite: the
// largest magnitude of each (NaN propagates through it), one foreach call; a
// buffer with infinities of its own (a mask) against its value before the step.
// Undefined when there are none (no work, nothing added to the host read).
at::Tensor buffers_nonfinite(const std::vector<WrittenBuffer>* buffers, const at::Tensor& like) {
  if (!buffers || buffers->empty()) return {};
  std::vector<at::Tensor> plain, flags;
  for (const WrittenBuffer& b : *buffers) {
    if (!b.before.defined())
      plain.push_back(b.buffer);
    else  // NaN != anything: a NaN anywhere counts, an unchanged -inf does not
      flags.push_back(
          (~at::isfinite(b.buffer) & (b.buffer != b.before)).any().to(like.device(), at::kFloat).reshape({1}));
  }
  if (!plain.empty()) {
    std::vector<at::Tensor> largest = at::_foreach_norm(plain, std::numeric_limits<double>::infinity());
    for (at::Tensor& m : largest) m = m.to(like.device(), at::kFloat).reshape({1});
    flags.push_back((~at::isfinite(at::cat(largest))).any().to(at::kFloat).reshape({1}));
  }
  return flags.size() == 1 ? flags.front() : at::cat(flags).max().reshape({1});
}

// Device values gathered into one float tensor and copied to the host once;
// each part is read back by the offset add() gave it.
class HostRead {
 public:
  static constexpr size_t kNone = SIZE_MAX;
  size_t add(const at::Tensor& t) {
    const size_t offset = size_;
    parts_.push_back(t.reshape({-1}).to(at::kFloat));
    size_ += size_t(parts_.back().numel());
    return offset;
  }
  void to_host() {
    const at::Device device = parts_.front().device();
    for (at::Tensor& p : parts_) p = p.to(device);
    host_ = at::cat(parts_).to(at::kCPU);
  }
  float operator[](size_t offset) const { return host_.data_ptr<float>()[offset]; }
  const float* at(size_t offset) const { return host_.data_ptr<float>() + offset; }

 private:
  std::vector<at::Tensor> parts_;
  size_t size_ = 0;
  at::Tensor host_;
};

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

  // The step's one host sync: everything below, each part named by where it lands.
  HostRead read;
  const size_t at_loss = read.add(loss.detach());
  const size_t at_norm = read.add(total_norm);
  const size_t at_found_inf = read.add(found_inf);
  const size_t at_batch_flag =
      read.add(settings.batch_nonfinite.defined() ? settings.batch_nonfinite : at::zeros_like(found_inf));
  const size_t at_local_norm = read.add(local_norm);
  const size_t at_buffers = buffers_bad.defined() ? read.add(buffers_bad) : HostRead::kNone;
  const size_t at_flags = settings.buckets ? read.add(averaged.flags) : HostRead::kNone;
  const size_t at_absmax =
      settings.batch_absmax.defined() && !settings.buckets ? read.add(settings.batch_absmax) : HostRead::kNone;
  const size_t at_norms = settings.parameter_norms && !norms.empty() ? read.add(at::stack(norms)) : HostRead::kNone;
  const bool want_averaged = settings.parameter_norms && settings.averaged_parameter_norms && settings.buckets;
  const size_t at_averaged_norms =
      want_averaged && !averaged.norms.empty() ? read.add(at::stack(averaged.norms)) : HostRead::kNone;
  read.to_host();

  StepOutcome out;
  out.loss = read[at_loss];
  out.grad_norm = read[at_norm];
  out.batch_finite = read[at_batch_flag] == 0.0f;
  out.local_loss_finite = std::isfinite(read[at_loss]);
  out.local_grads_finite = std::isfinite(read[at_local_norm]) && read[at_found_inf] == 0.0f;
  if (at_buffers != HostRead::kNone) out.buffers_finite = read[at_buffers] == 0.0f;
  if (settings.buckets) {
    const FlagLayout at_{settings.buckets->world_size()};
    const float* flags = read.at(at_flags);
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
    out.loss_finite = !any_loss;
    out.grads_finite = !any_grads && std::isfinite(out.grad_norm);
    out.allreduce_seconds = averaged.seconds;
  } else {
    out.global_loss = out.loss;
    out.loss_finite = out.local_loss_finite;
    out.grads_finite = out.local_grads_finite && std::isfinite(out.grad_norm);
    if (!out.finite()) out.nonfinite_ranks.push_back(0);
    if (at_absmax != HostRead::kNone) out.batch_absmax = read[at_absmax];
  }
  if (settings.parameter_norms) {
    // Parameters without a gradient (unused this step) read as 0.
    out.parameter_norms.assign(parameters.size(), 0.0f);
    const float* norm = at_norms != HostRead::kNone ? read.at(at_norms) : nullptr;
    for (size_t i = 0; i < parameters.size(); ++i)
      if (had_grad[i]) out.parameter_norms[i] = *norm++;
    // After averaging every parameter has a gradient.
    if (at_averaged_norms != HostRead::kNone && averaged.norms.size() == parameters.size())
      out.global_parameter_norms.assign(read.at(at_averaged_norms), read.at(at_averaged_norms) + averaged.norms.size());
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
