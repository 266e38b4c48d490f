#include "nanscope/core/state_ring.hpp"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

namespace {

std::vector<at::Tensor> host_copies(const NamedTensors& tensors, std::vector<at::Tensor> spares) {
  TensorRecycler recycler(std::move(spares));
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back(recycler.copy(t, at::kCPU));
  return out;
}

void copy_back(const NamedTensors& targets, const std::vector<at::Tensor>& saved) {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < targets.size() && i < saved.size(); ++i) {
    at::Tensor target = targets[i].second;
    // A dtype change since (the fp32 fallback) keeps today's dtype.
    target.copy_(saved[i]);
  }
}

size_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  size_t n = 0;
  for (const auto& t : tensors) n += t.numel() * t.element_size();
  return n;
}

at::Device device_of(const TrainableModel& model) {
  const NamedTensors params = model.named_parameters();
  return params.empty() ? at::Device(at::kCPU) : params.front().second.device();
}

}  // namespace

size_t TrainingState::bytes() const {
  return tensor_bytes(parameters) + tensor_bytes(buffers) + optimizer.size() +
         (cpu_rng.defined() ? cpu_rng.numel() : 0) + (device_rng.defined() ? device_rng.numel() : 0);
}

StateRing::StateRing(size_t max_states, size_t max_bytes) : max_states_(max_states), max_bytes_(max_bytes) {}

bool StateRing::save(int64_t step, const TrainableModel& model, const torch::optim::Optimizer& optimizer,
                     const LossScaler& scaler) {
  if (max_states_ == 0) return false;
  // The state this one displaces (the ring is full) goes first and lends it its memory.
  TrainingState displaced;
  if (states_.size() >= max_states_) {
    displaced = std::move(states_.front());
    states_.pop_front();
  }
  TrainingState s;
  s.step = step;
  s.parameters = host_copies(model.named_parameters(), std::move(displaced.parameters));
  s.buffers = host_copies(model.named_buffers(), std::move(displaced.buffers));
  TensorRecycler optimizer_memory(displaced.optimizer.copy ? displaced.optimizer.copy->tensors()
                                                           : std::vector<at::Tensor>{});
  displaced.optimizer = {};  // its tensors now held by the recycler alone
  s.optimizer = save_optimizer(optimizer, &optimizer_memory);
  s.scaler = scaler;
  s.cpu_rng = at::detail::getDefaultCPUGenerator().get_state();
  const at::Device device = device_of(model);
  if (device.is_cuda()) s.device_rng = at::globalContext().defaultGenerator(device).get_state();
  if (s.bytes() > max_bytes_) return false;
  while (!states_.empty() && (states_.size() >= max_states_ || bytes() + s.bytes() > max_bytes_)) states_.pop_front();
  states_.push_back(std::move(s));
  return true;
}

const TrainingState* StateRing::newest_before(int64_t step) const {
  for (auto it = states_.rbegin(); it != states_.rend(); ++it)
    if (it->step < step) return &*it;
  return nullptr;
}

void StateRing::restore(const TrainingState& state, TrainableModel& model, torch::optim::Optimizer& optimizer,
                        LossScaler& scaler) {
  copy_back(model.named_parameters(), state.parameters);
  copy_back(model.named_buffers(), state.buffers);
  restore_optimizer(optimizer, state.optimizer);
  scaler = state.scaler;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  cpu.set_state(state.cpu_rng);
  if (state.device_rng.defined()) {
    at::Generator gen = at::globalContext().defaultGenerator(device_of(model));
    gen.set_state(state.device_rng);
  }
}

void StateRing::forget_from(int64_t step) {
  while (!states_.empty() && states_.back().step >= step) states_.pop_back();
}

size_t StateRing::bytes() const {
  size_t n = 0;
  for (const auto& s : states_) n += s.bytes();
  return n;
}

}  // namespace nanscope
