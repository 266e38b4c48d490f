#include "nanscope/core/train_step.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/vocabulary.hpp"
#include "nanscope/probe/finiteness.hpp"
#include "nanscope/probe/host_norms.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/nvtx.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope {

at::ScalarType autocast_dtype(Amp amp) { return amp == Amp::fp16 ? at::kHalf : at::kBFloat16; }

namespace {

at::DeviceType device_of(const Batch& batch) {
  const std::vector<at::Tensor> tensors = batch.tensors();
  return tensors.empty() ? at::kCPU : tensors.front().device().type();
}

}  // namespace

at::Tensor forward_backward(TrainableModel& model, Amp amp, double loss_scale, const Batch& batch) {
  at::Tensor loss;
  {
    NANSCOPE_NVTX_RANGE("forward");
    // P4: autocast covers forward and loss only, never backward.
    compat::AutocastGuard autocast(device_of(batch), autocast_dtype(amp), amp != Amp::fp32);
    loss = model.loss(batch);
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

namespace {

// Norms from the squares summed on the host, as tensors like LibTorch's.
GradNorms norms_of(const std::vector<double>& squares) {
  GradNorms out{at::empty({int64_t(squares.size())}, at::kFloat), at::empty({}, at::kFloat)};
  float* each = out.each.data_ptr<float>();
  double sum = 0;
  for (size_t i = 0; i < squares.size(); ++i) {
    each[i] = float(std::sqrt(squares[i]));
    sum += squares[i];
  }
  *out.total.data_ptr<float>() = float(std::sqrt(sum));
  return out;
}

}  // namespace

GradNorms grad_norms(const std::vector<at::Tensor>& grads, GradNormUse use) {
  if (grads.empty()) return {{}, at::zeros({})};
  if (use == GradNormUse::for_the_record)
    if (const std::optional<std::vector<double>> squares = probe::squared_norms_on_host(grads))
      return norms_of(*squares);
  std::vector<at::Tensor> each;
  // A sparse gradient (nn.Embedding(sparse=True)) has no foreach kernel on
  // LibTorch 1.13: its norm is taken alone, by the call clip_grad_norm_ makes there.
  const auto sparse = [](const at::Tensor& g) { return g.is_sparse(); };
  if (std::none_of(grads.begin(), grads.end(), sparse)) {
    each = at::_foreach_norm(grads);
  } else {
    std::vector<at::Tensor> dense;
    for (const at::Tensor& g : grads)
      if (!g.is_sparse()) dense.push_back(g);
    std::vector<at::Tensor> dense_norms = dense.empty() ? dense : at::_foreach_norm(dense);
    size_t next_dense = 0;
    for (const at::Tensor& g : grads) each.push_back(g.is_sparse() ? at::norm(g, 2) : dense_norms[next_dense++]);
  }
  GradNorms out;
  out.each = at::stack(each);
  // As torch.nn.utils.get_total_norm takes it, op for op: a clip given this
  // norm (the Accelerate integration's) clips as clip_grad_norm_ would, bit for bit.
  out.total = at::linalg_vector_norm(out.each, 2);
  return out;
}

StepRecomputation recompute_step(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp,
                                 double loss_scale, const StepSetup& setup, const Batch& batch) {
  return recompute_step(model, parameters, amp, loss_scale, setup, std::vector<MicroBatch>{MicroBatch{batch, {}, 1.0}});
}

StepRecomputation recompute_step(TrainableModel& model, const std::vector<at::Tensor>& parameters, Amp amp,
                                 double loss_scale, const StepSetup& setup,
                                 const std::vector<MicroBatch>& micro_batches, probe::OpCapture* capture) {
  clear_grads(parameters);
  KeepBuffers buffers_as_found(model);
  StepRecomputation out;
  out.derived_weights.assign(micro_batches.size(), std::numeric_limits<double>::quiet_NaN());
  {
    const ScopedStepSetup as_the_step_ran(setup);
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      const MicroBatch& micro = micro_batches[k];
      micro.cpu_rng_state.restore();
      if (capture && micro_batches.size() > 1)
        capture->begin_micro_batch(int64_t(k), micro.batch.rows(), micro.batch.row_dim);
      probe::note_step_batch(micro.batch.tensors());  // under a capture: its non-finite leaves are followed
      at::Tensor loss;
      {
        NANSCOPE_NVTX_RANGE("forward");
        compat::AutocastGuard autocast(device_of(micro.batch), autocast_dtype(amp), amp != Amp::fp32);
        loss = model.loss(micro.batch);
      }
      double weight = micro.loss_weight;
      if (std::isfinite(micro.recorded_loss)) {
        // The loop's own weighting (loss / accumulation steps), read off its loss.
        const double value = loss.detach().item<double>();
        if (std::isfinite(value) && value != 0.0) {
          weight = micro.recorded_loss / value;
          out.derived_weights[k] = weight;
        }
      }
      {
        NANSCOPE_NVTX_RANGE("backward");
        (loss * (loss_scale * weight)).backward();
      }
      // The step's loss, as the loop summed its micro-batches' weighted losses.
      const at::Tensor weighted = loss.detach() * weight;
      out.loss = out.loss.defined() ? out.loss + weighted : weighted;
    }
  }
  out.buffers_bad = buffers_as_found.turned_nonfinite();
  // Finite gradients whose norm overflows are a non-finite step too (P18).
  probe::PhaseScope phase(format::Phase::grad_norm);
  std::vector<at::Tensor> grads = defined_grads(parameters);
  LossScalerConfig same_scale;
  same_scale.enabled = loss_scale != 1.0;
  same_scale.init_scale = loss_scale;
  out.found_inf = same_scale.enabled ? LossScaler(same_scale).unscale_(grads) : at::zeros({1});
  out.total_norm = grad_norms(grads, GradNormUse::as_a_value).total;
  // Under a capture: the births whose values reached these are the step's.
  std::vector<at::Tensor> ended_with = grads;
  ended_with.push_back(out.loss);
  ended_with.push_back(out.total_norm);
  probe::note_step_result(ended_with);
  return out;
}

bool StepRecomputation::finite() const {
  return std::isfinite(loss.item<double>()) && std::isfinite(total_norm.item<double>()) &&
         found_inf.item<float>() == 0.0f && !(buffers_bad.defined() && buffers_bad.item<bool>());
}

namespace {

// Data parallel: one [4 x world + 1] flag vector, summed across ranks: each
// rank's "gradients non-finite" and "loss non-finite" slots, one "stop" slot
// for Ctrl-C, each rank's loss and each rank's batch abs-max. A rank writes its
// own slots only (zeros elsewhere), so the sum leaves every slot its rank's
// value (x + 0 is x, a NaN or an infinity included) and the stop slot non-zero
// if any rank asked. Every rank then holds every verdict and loss, so all of
// them skip, warn and roll back alike. A sum is what the gradients' own
// reduction does, so the flags can ride in it: appended to the last gradient
// bucket (the trainer's buckets, DDP's last bucket through the guard's
// communication hook), they add no round of their own. The global norm is
// taken over the averaged gradients. Still on the device: the host read comes
// after.
//
// A sharded model's gradients are reduced already, each rank holding a shard
// of each: the same flags and the squared norm of each parameter's shard are
// summed in one collective, which gives every rank the norms of the whole
// gradients (per parameter and in all) without gathering them.
struct FlagLayout {
  int world;
  int grads(int r) const { return r; }
  int loss_bad(int r) const { return world + r; }
  int stop() const { return 2 * world; }
  int loss(int r) const { return 2 * world + 1 + r; }
  int absmax(int r) const { return 3 * world + 1 + r; }
  int size() const { return 4 * world + 1; }
};
struct AveragedGradients {
  at::Tensor flags, total_norm;
  at::Tensor own_nonfinite;  // where the backward averaged: this rank's gradients before they mixed (1: non-finite)
  at::Tensor norms;          // per parameter with a gradient; a sharded model's: per parameter
  double seconds = 0;
};
// 1 when the forward left a value of a buffer it wrote non-finite
// (probe::any_nonfinite, for all of them at once); a buffer with infinities of
// its own (a mask) against its value before the step.
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
    const at::Tensor bad = probe::any_nonfinite(plain);
    flags.push_back(bad.device() == like.device() ? bad : bad.to(like.device()));
  }
  return flags.size() == 1 ? flags.front() : at::cat(flags).max().reshape({1});
}

// This rank's flags (FlagLayout): its own slots, zeros elsewhere; `grads_bad`
// its gradients' verdict.
at::Tensor rank_flags(const StepSettings& settings, const at::Tensor& loss, const at::Tensor& grads_bad,
                      const at::TensorOptions& options) {
  const FlagLayout at_{settings.buckets->world_size()};
  const int rank = settings.buckets->rank();
  at::Tensor flags = at::zeros({at_.size()}, options.dtype(at::kFloat));
  if (settings.stop_requested) flags[at_.stop()].fill_(1);
  flags[at_.grads(rank)].copy_(grads_bad.to(at::kFloat));
  const at::Tensor l = loss.detach().reshape({}).to(at::kFloat);
  flags[at_.loss_bad(rank)].copy_((~at::isfinite(l)).to(at::kFloat));
  flags[at_.loss(rank)].copy_(l);
  if (settings.batch_absmax.defined()) flags[at_.absmax(rank)].copy_(settings.batch_absmax.reshape({}));
  return flags;
}

// Where the backward averaged the gradients, this rank's own from before
// they mixed; else the unscaled ones'. A buffer the forward left non-finite counts.
at::Tensor grads_bad_of(const at::Tensor& own_nonfinite, const UnscaledGradients* unscaled,
                        const at::Tensor& buffers_bad) {
  at::Tensor bad = own_nonfinite.defined()
                       ? own_nonfinite.reshape({}) > 0
                       : (unscaled->found_inf.reshape({}) > 0) | ~at::isfinite(unscaled->total_norm);
  if (buffers_bad.defined()) bad = bad | (buffers_bad.reshape({}) > 0);
  return bad;
}

// A sharded model's flags and, after them, each parameter's squared shard
// norm (0 for a shard without a gradient): one tensor for the ranks to sum.
at::Tensor flags_and_shard_squares(const StepSettings& settings, const std::vector<at::Tensor>& parameters,
                                   const at::Tensor& loss, const at::Tensor& buffers_bad,
                                   const UnscaledGradients& unscaled) {
  const at::Tensor flags =
      rank_flags(settings, loss, grads_bad_of({}, &unscaled, buffers_bad), unscaled.found_inf.options());
  if (parameters.empty()) return flags;
  std::vector<int64_t> with_grad;
  for (size_t i = 0; i < parameters.size(); ++i)
    if (unscaled.had_grad[i]) with_grad.push_back(int64_t(i));
  at::Tensor squares = at::zeros({int64_t(parameters.size())}, flags.options());
  if (!with_grad.empty())
    squares.index_copy_(0, at::tensor(with_grad, at::kLong).to(squares.device()),
                        unscaled.norms.to(at::kFloat).square());
  return at::cat({flags, squares});
}

// A sharded model: the flags and shard norms summed (or the sum begun at
// unscale() waited for), which gives every rank the whole gradients' norms.
AveragedGradients sum_across_shards(const StepSettings& settings, const std::vector<at::Tensor>& parameters,
                                    const at::Tensor& loss, const at::Tensor& buffers_bad,
                                    const UnscaledGradients& unscaled) {
  GradientAverager& ranks = *settings.buckets;
  const FlagLayout at_{ranks.world_size()};
  AveragedGradients out;
  const at::Tensor both = settings.begun_flags
                              ? settings.begun_flags->flags
                              : flags_and_shard_squares(settings, parameters, loss, buffers_bad, unscaled);
  const auto start = std::chrono::steady_clock::now();
  ranks.sum(both);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.flags = both.narrow(0, 0, at_.size());
  const at::Tensor global = both.narrow(0, at_.size(), int64_t(parameters.size()));
  out.total_norm = global.sum().sqrt();
  out.norms = global.sqrt();
  return out;
}

AveragedGradients average_across_ranks(const StepSettings& settings, const std::vector<at::Tensor>& parameters,
                                       const at::Tensor& loss, const at::Tensor& buffers_bad,
                                       const UnscaledGradients& unscaled) {
  NANSCOPE_NVTX_RANGE("all_reduce");
  GradientAverager& ranks = *settings.buckets;
  if (ranks.sharded()) return sum_across_shards(settings, parameters, loss, buffers_bad, unscaled);
  AveragedGradients out;
  if (settings.begun_flags) {
    // Begun in DDP's last bucket or at unscale(): only the wait is left.
    out.flags = settings.begun_flags->flags;
    out.own_nonfinite = settings.begun_flags->own_nonfinite;
  } else {
    // This rank's own gradients: after DDP's backward averaged them, the
    // unscaled ones are every rank's, and only its note from before names the rank.
    out.own_nonfinite = ranks.own_gradients_nonfinite();
    out.flags = rank_flags(settings, loss, grads_bad_of(out.own_nonfinite, &unscaled, buffers_bad),
                           unscaled.found_inf.options());
  }
  const auto start = std::chrono::steady_clock::now();
  ranks.average(out.flags);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (out.own_nonfinite.defined()) {  // averaged before they were unscaled: their norms are taken
    out.norms = unscaled.norms;
    out.total_norm = unscaled.total_norm;
    return out;
  }
  GradNorms averaged = grad_norms(defined_grads(parameters), GradNormUse::as_a_value);
  out.norms = std::move(averaged.each);
  out.total_norm = std::move(averaged.total);
  return out;
}

// The values a step reads, each part read back by the offset add() gave it.
// On a device they are gathered into one float tensor and copied to the host
// once (the step's one sync); on the CPU each is read where it lies, with no
// kernel to gather them.
class HostRead {
 public:
  static constexpr size_t kNone = SIZE_MAX;
  size_t add(const at::Tensor& t) {
    const size_t offset = size_;
    parts_.push_back(t);
    size_ += size_t(t.numel());
    return offset;
  }
  void to_host() {
    host_.reserve(size_);
    bool on_host = true;
    for (const at::Tensor& p : parts_) on_host = on_host && p.is_cpu();
    if (on_host) {
      for (const at::Tensor& p : parts_)
        append(p.scalar_type() == at::kFloat ? p.contiguous() : p.to(at::kFloat).contiguous());
      return;
    }
    const at::Device device = parts_.front().device();
    std::vector<at::Tensor> flat;
    flat.reserve(parts_.size());
    for (const at::Tensor& p : parts_) flat.push_back(p.reshape({-1}).to(device, at::kFloat));
    append(at::cat(flat).to(at::kCPU));
  }
  float operator[](size_t offset) const { return host_[offset]; }
  const float* at(size_t offset) const { return host_.data() + offset; }

 private:
  void append(const at::Tensor& floats) {
    const float* begin = floats.data_ptr<float>();
    host_.insert(host_.end(), begin, begin + floats.numel());
  }
  std::vector<at::Tensor> parts_;
  size_t size_ = 0;
  std::vector<float> host_;
};

// The finiteness verdict and the norms, copied to the host once.
// Every rank's verdict, from the flags the ranks summed (FlagLayout).
void read_every_ranks_flags(StepOutcome& out, const float* flags, const StepSettings& settings, bool sharded) {
  const FlagLayout at_{settings.buckets->world_size()};
  bool any_grads = false, any_loss = false;
  double loss_sum = 0;
  std::vector<int> loss_ranks;
  for (int r = 0; r < at_.world; ++r) {
    const bool grads_bad = flags[at_.grads(r)] != 0.0f, loss_bad = flags[at_.loss_bad(r)] != 0.0f;
    if (grads_bad || loss_bad) out.nonfinite_ranks.push_back(r);
    if (loss_bad) loss_ranks.push_back(r);
    any_grads |= grads_bad;
    any_loss |= loss_bad;
    loss_sum += flags[at_.loss(r)];
  }
  // A sharded model's reduce-scatter spreads one rank's non-finite gradient
  // into every rank's shards: there the losses name the ranks, where they can.
  if (sharded && !loss_ranks.empty()) out.nonfinite_ranks = loss_ranks;
  out.stop_requested = flags[at_.stop()] != 0.0f;
  out.global_loss = any_loss ? std::numeric_limits<double>::quiet_NaN() : loss_sum / at_.world;
  if (settings.batch_absmax.defined())
    for (int r = 0; r < at_.world; ++r) out.batch_absmax = std::max(out.batch_absmax, double(flags[at_.absmax(r)]));
  out.loss_finite = !any_loss;
  out.grads_finite = !any_grads && std::isfinite(out.grad_norm);
}

// The parameters' gradient norms as read: `norms` one per parameter that had
// a gradient (the others read as 0: unused this step), `averaged` one per
// parameter after averaging (nullptr: not read). A shard's norm is a part:
// the run records the whole gradients' norms.
void read_parameter_norms(StepOutcome& out, const std::vector<bool>& had_grad, const float* norms,
                          const float* averaged, bool sharded) {
  out.parameter_norms.assign(had_grad.size(), 0.0f);
  for (size_t i = 0; i < had_grad.size(); ++i)
    if (had_grad[i] && norms) out.parameter_norms[i] = *norms++;
  if (averaged) out.global_parameter_norms.assign(averaged, averaged + had_grad.size());
  if (sharded) out.parameter_norms = out.global_parameter_norms;
}

StepOutcome check_gradients(const std::vector<at::Tensor>& parameters, const UnscaledGradients& unscaled,
                            const StepSettings& settings, const at::Tensor& loss) {
  NANSCOPE_NVTX_RANGE("unscale_and_check");
  const at::Tensor& found_inf = unscaled.found_inf;
  const at::Tensor& local_norm = unscaled.total_norm;
  const std::vector<bool>& had_grad = unscaled.had_grad;
  const at::Tensor buffers_bad =
      settings.begun_flags ? settings.begun_flags->buffers_bad : buffers_nonfinite(settings.written_buffers, found_inf);
  AveragedGradients averaged;
  if (settings.buckets) averaged = average_across_ranks(settings, parameters, loss, buffers_bad, unscaled);
  const at::Tensor& total_norm = settings.buckets ? averaged.total_norm : local_norm;

  // The step's one host sync: everything below, each part named by where it lands.
  HostRead read;
  const size_t at_loss = read.add(loss.variable_data());  // its value, off the graph, without a dispatch
  const size_t at_norm = read.add(total_norm);
  const size_t at_found_inf = read.add(found_inf);
  const size_t at_local_norm = read.add(local_norm);
  const size_t at_buffers = buffers_bad.defined() ? read.add(buffers_bad) : HostRead::kNone;
  const size_t at_flags = settings.buckets ? read.add(averaged.flags) : HostRead::kNone;
  const size_t at_own = averaged.own_nonfinite.defined() ? read.add(averaged.own_nonfinite) : HostRead::kNone;
  const size_t at_absmax =
      settings.batch_absmax.defined() && !settings.buckets ? read.add(settings.batch_absmax) : HostRead::kNone;
  // A sharded model's norms are the whole gradients': only the summed ones mean anything.
  const bool sharded = settings.buckets && settings.buckets->sharded();
  const size_t at_norms =
      settings.parameter_norms && unscaled.norms.defined() && !sharded ? read.add(unscaled.norms) : HostRead::kNone;
  const size_t at_micro = settings.micro_losses.defined() ? read.add(settings.micro_losses) : HostRead::kNone;
  const bool want_averaged =
      settings.parameter_norms && settings.buckets && (settings.averaged_parameter_norms || sharded);
  const size_t at_averaged_norms =
      want_averaged && averaged.norms.defined() ? read.add(averaged.norms) : HostRead::kNone;
  read.to_host();

  StepOutcome out;
  out.loss = read[at_loss];
  out.grad_norm = read[at_norm];
  out.local_loss_finite = std::isfinite(read[at_loss]);
  out.local_grads_finite = at_own != HostRead::kNone ? read[at_own] == 0.0f
                                                     : std::isfinite(read[at_local_norm]) && read[at_found_inf] == 0.0f;
  if (at_buffers != HostRead::kNone) out.buffers_finite = read[at_buffers] == 0.0f;
  if (settings.buckets) {
    read_every_ranks_flags(out, read.at(at_flags), settings, sharded);
    out.allreduce_seconds = averaged.seconds;
  } else {
    out.global_loss = out.loss;
    out.loss_finite = out.local_loss_finite;
    out.grads_finite = out.local_grads_finite && std::isfinite(out.grad_norm);
    if (!out.finite()) out.nonfinite_ranks.push_back(0);
    if (at_absmax != HostRead::kNone) out.batch_absmax = read[at_absmax];
  }
  if (at_micro != HostRead::kNone)
    out.micro_losses.assign(read.at(at_micro), read.at(at_micro) + settings.micro_losses.numel());
  if (settings.parameter_norms) {
    // After averaging every parameter has a gradient; a shard's norm is a part.
    const bool averaged_all =
        at_averaged_norms != HostRead::kNone && averaged.norms.numel() == int64_t(parameters.size());
    read_parameter_norms(out, had_grad, at_norms != HostRead::kNone ? read.at(at_norms) : nullptr,
                         averaged_all ? read.at(at_averaged_norms) : nullptr, sharded);
  }
  return out;
}

}  // namespace

at::Tensor prepare_rank_flags(StepSettings& settings, const at::Tensor& loss) {
  GradientAverager* const ranks = settings.buckets;
  if (!ranks || ranks->sharded()) return {};
  StepSettings::BegunFlags begun;
  begun.own_nonfinite = ranks->own_gradients_nonfinite();
  if (!begun.own_nonfinite.defined()) return {};  // the averager averages the gradients itself, in average()
  begun.buffers_bad = buffers_nonfinite(settings.written_buffers, begun.own_nonfinite);
  begun.flags = rank_flags(settings, loss, grads_bad_of(begun.own_nonfinite, nullptr, begun.buffers_bad),
                           begun.own_nonfinite.options());
  at::Tensor flags = begun.flags;
  settings.begun_flags = std::move(begun);
  return flags;
}

void begin_reducing_flags(StepSettings& settings, const at::Tensor& loss, const std::vector<at::Tensor>& parameters,
                          const UnscaledGradients& unscaled) {
  GradientAverager* const ranks = settings.buckets;
  if (!ranks) return;
  if (ranks->sharded()) {
    StepSettings::BegunFlags begun;
    begun.buffers_bad = buffers_nonfinite(settings.written_buffers, unscaled.found_inf);
    begun.flags = flags_and_shard_squares(settings, parameters, loss, begun.buffers_bad, unscaled);
    ranks->begin_sum(begun.flags);
    settings.begun_flags = std::move(begun);
    return;
  }
  const at::Tensor flags = prepare_rank_flags(settings, loss);
  if (flags.defined()) ranks->begin_average(flags);
}

UnscaledGradients unscale_gradients(LossScaler& scaler, const std::vector<at::Tensor>& parameters,
                                    const at::Tensor& like, GradNormUse use) {
  UnscaledGradients out;
  std::vector<at::Tensor> grads = defined_grads(parameters);
  out.found_inf = scaler.enabled() ? scaler.unscale_(grads) : scaler.none_found(like.device());
  GradNorms norms = grad_norms(grads, use);
  out.norms = std::move(norms.each);
  out.total_norm = std::move(norms.total);
  // Which parameters had a gradient here (the norms are theirs), taken before
  // averaging gives every parameter one.
  for (const auto& p : parameters) out.had_grad.push_back(p.grad().defined());
  return out;
}

namespace {

void zero_grads_in_place(const std::vector<at::Tensor>& parameters) {
  at::NoGradGuard no_grad;
  for (const auto& p : parameters)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

}  // namespace

void clip_gradients(const std::vector<at::Tensor>& parameters, double grad_norm, double clip) {
  if (!(clip > 0 && grad_norm > clip)) return;
  std::vector<at::Tensor> dense;
  for (const at::Tensor& g : defined_grads(parameters)) {
    if (g.is_sparse())
      g.mul_(clip / (grad_norm + 1e-6));  // no foreach kernel on LibTorch 1.13
    else
      dense.push_back(g);
  }
  at::_foreach_mul_(dense, clip / (grad_norm + 1e-6));
}

namespace {

// A norm the guard clips with, or the ranks combine, is a value.
GradNormUse norms_for(const StepSettings& settings) {
  return settings.clip > 0 || settings.buckets ? GradNormUse::as_a_value : GradNormUse::for_the_record;
}

}  // namespace

namespace {

// Micro-batches whose NaN loss is a mean over no target, with exactly zero
// gradients, add nothing to the update: they leave the step's loss and the
// update goes on with the others, as a plain loop's would (the gradients
// are the others', to the bit).
void leave_out_losses_adding_nothing(StepOutcome& out, const StepSettings& settings) {
  if (out.loss_finite || !out.grads_finite || !out.buffers_finite || settings.buckets ||
      !settings.losses_adding_nothing)
    return;
  out.adding_nothing = settings.losses_adding_nothing(out);
  if (out.adding_nothing.empty()) return;
  double kept = 0;
  for (float micro_loss : out.micro_losses)
    if (std::isfinite(micro_loss)) kept += micro_loss;
  out.loss = out.global_loss = kept;
  out.loss_finite = out.local_loss_finite = true;
  out.nonfinite_ranks.clear();
}

}  // namespace

StepOutcome finish_step(LossScaler& scaler, const std::vector<at::Tensor>& parameters, const StepSettings& settings,
                        const at::Tensor& loss, const StepFinish& finish) {
  const UnscaledGradients unscaled =
      finish.unscaled ? *finish.unscaled : unscale_gradients(scaler, parameters, loss, norms_for(settings));
  StepOutcome out = check_gradients(parameters, unscaled, settings, loss);
  leave_out_losses_adding_nothing(out, settings);
  out.skipped_as_spike = out.finite() && out.global_loss > settings.skip_loss_above;
  if (!out.finite() || out.skipped_as_spike) {
    // P14: skip the batch. Gradients go; weights and optimizer state are untouched.
    if (finish.zero_grads_in_place)
      zero_grads_in_place(parameters);
    else
      clear_grads(parameters);
    out.skipped = true;
  } else if (finish.optimizer) {
    NANSCOPE_NVTX_RANGE("optimizer");
    clip_gradients(parameters, out.grad_norm, settings.clip);
    // The guard's cut applies to this update only: the loop's LR stays the loop's.
    std::optional<GroupLrScope> cut;
    if (finish.lr_multiplier != 1.0) cut.emplace(*finish.optimizer).scale(finish.lr_multiplier);
    if (finish.reevaluate) {
      ClosureEvaluations evaluations =
          step_with_closure(*finish.optimizer, parameters, loss.detach(), finish.reevaluate);
      if (evaluations.failed > 0) {  // the weights and the optimizer's state are as before the step
        out.loss_finite = out.local_loss_finite = evaluations.loss_finite;
        out.grads_finite = out.local_grads_finite = false;
        out.nonfinite_ranks = {0};
        out.skipped = true;
      }
      if (finish.evaluations) *finish.evaluations = std::move(evaluations);
    } else {
      finish.optimizer->step();
    }
  } else {
    clip_gradients(parameters, out.grad_norm, settings.clip);
  }
  scaler.update(!out.finite());
  return out;
}

StepOutcome train_step(TrainableModel& model, torch::optim::Optimizer& optimizer, LossScaler& scaler,
                       const std::vector<at::Tensor>& parameters, const StepSettings& settings, const Batch& batch,
                       double lr_multiplier, ClosureEvaluations* evaluations) {
  clear_grads(parameters);
  const at::Tensor loss = forward_backward(model, settings.amp, scaler.scale(), batch);
  StepFinish finish;
  finish.optimizer = &optimizer;
  finish.lr_multiplier = lr_multiplier;
  if (evaluates_closure(optimizer)) {
    // Each later evaluation as the step's own: precision, loss scale, the
    // unscale and the clip; checked on the host (the optimizer reads the loss there anyway).
    finish.reevaluate = [&] {
      clear_grads(parameters);
      Evaluation e;
      e.loss = forward_backward(model, settings.amp, scaler.scale(), batch).detach();
      const UnscaledGradients grads = unscale_gradients(scaler, parameters, e.loss, GradNormUse::as_a_value);
      const double norm = grads.total_norm.item<double>();
      e.loss_finite = std::isfinite(e.loss.item<double>());
      e.grads_finite = grads.found_inf.item<float>() == 0.0f && std::isfinite(norm);
      if (e.grads_finite) clip_gradients(parameters, norm, settings.clip);
      return e;
    };
    finish.evaluations = evaluations;
    return finish_step(scaler, parameters, settings, loss, finish);  // its evaluations run the model
  }
  try {
    return finish_step(scaler, parameters, settings, loss, finish);
  } catch (const std::exception& e) {
    throw UpdateRaised(e.what(), std::current_exception());
  }
}

}  // namespace nanscope
