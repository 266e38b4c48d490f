#include "nanscope/core/optimizer.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/probe/host_copy.hpp"

namespace nanscope {

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void scale_lr(torch::optim::Optimizer& optimizer, double factor) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(group.options().get_lr() * factor);
}

std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
  return out;
}

GroupLrScope::GroupLrScope(torch::optim::Optimizer& optimizer) : optimizer_(optimizer), kept_(group_lrs(optimizer)) {}

GroupLrScope::~GroupLrScope() {
  for (size_t i = 0; i < kept_.size(); ++i) optimizer_.param_groups()[i].options().set_lr(kept_[i]);
}

void GroupLrScope::scale(double multiplier) {
  for (size_t i = 0; i < kept_.size(); ++i) optimizer_.param_groups()[i].options().set_lr(kept_[i] * multiplier);
}

void GroupLrScope::set(const std::vector<double>& lrs) {
  for (size_t i = 0; i < kept_.size() && i < lrs.size(); ++i) optimizer_.param_groups()[i].options().set_lr(lrs[i]);
}

namespace {

// Calls each(tensor) on every tensor field of one parameter's state, for the
// optimizers LibTorch ships whose state is tensors and counters; false for
// any other kind (an optimizer of your own). `State` is const or not, and so
// is each field handed on: the one list of those kinds and their tensors.
template <class Kind, class State>
auto* state_as(State& state) {
  return dynamic_cast<std::conditional_t<std::is_const_v<State>, const Kind, Kind>*>(&state);
}

template <class State, class Each>
bool for_each_state_tensor(State& state, Each&& each) {
  using namespace torch::optim;
  if (auto* s = state_as<AdamParamState>(state)) {
    each(s->exp_avg()), each(s->exp_avg_sq()), each(s->max_exp_avg_sq());
  } else if (auto* s = state_as<AdamWParamState>(state)) {
    each(s->exp_avg()), each(s->exp_avg_sq()), each(s->max_exp_avg_sq());
  } else if (auto* s = state_as<SGDParamState>(state)) {
    each(s->momentum_buffer());
  } else if (auto* s = state_as<RMSpropParamState>(state)) {
    each(s->square_avg()), each(s->momentum_buffer()), each(s->grad_avg());
  } else if (auto* s = state_as<AdagradParamState>(state)) {
    each(s->sum());
  } else {
    return false;
  }
  return true;
}

// The defined tensors of one parameter's state, of the kinds for_each_state_tensor knows.
std::vector<at::Tensor> optimizer_state_tensors_of(const torch::optim::OptimizerParamState& state) {
  std::vector<at::Tensor> out;
  for_each_state_tensor(state, [&](const at::Tensor& t) {
    if (t.defined()) out.push_back(t);
  });
  return out;
}

}  // namespace

std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& [key, state] : optimizer.state())
    for (at::Tensor& t : optimizer_state_tensors_of(*state)) out.push_back(std::move(t));
  return out;
}

NamedTensors optimizer_state_by_name(const torch::optim::Optimizer& optimizer, const NamedTensors& parameters) {
  if (const auto* own = dynamic_cast<const CopiesItsState*>(&optimizer)) return own->state_by_name(parameters);
  NamedTensors out;
  for (const auto& [name, p] : parameters) {
    const torch::optim::OptimizerParamState* state = compat::find_param_state(optimizer, p);
    if (!state) continue;
    if (auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      out.emplace_back(name + "/step", at::full({}, adam->step(), at::kLong));
      out.emplace_back(name + "/exp_avg", adam->exp_avg());
      out.emplace_back(name + "/exp_avg_sq", adam->exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      if (sgd->momentum_buffer().defined()) out.emplace_back(name + "/momentum_buffer", sgd->momentum_buffer());
    }
  }
  return out;
}

std::string optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  // LibTorch's L-BFGS keeps scratch space (`al`, one slot per history entry,
  // refilled on every iteration before it is read) that its serializer cannot
  // write while a slot is empty. Dropped, it is made again on the next step.
  for (auto& [key, state] : const_cast<torch::optim::Optimizer&>(optimizer).state())
    if (auto* lbfgs = dynamic_cast<torch::optim::LBFGSParamState*>(state.get())) lbfgs->al(c10::nullopt);
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return std::move(bytes).str();
}

void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  // load() only replaces the slots the archive holds: state a parameter
  // gained after the save must go too.
  optimizer.state().clear();
  optimizer.load(archive);
}

namespace {

// A LibTorch optimizer's per-parameter state with its tensors copied;
// nullptr for a kind for_each_state_tensor does not know, which is
// serialized instead.
std::unique_ptr<torch::optim::OptimizerParamState> deep_copy(const torch::optim::OptimizerParamState& state,
                                                             TensorRecycler& recycler) {
  std::unique_ptr<torch::optim::OptimizerParamState> copy = state.clone();  // its counters; the tensors shared
  const bool known = for_each_state_tensor(*copy, [&](at::Tensor& t) {
    if (t.defined()) t = recycler.copy(t, t.device());
  });
  return known ? std::move(copy) : nullptr;
}

// Copying the tensors costs a memcpy each; the serialization it replaces
// (an archive written into a string) cost a 1.3M-parameter Adam about 20 ms
// per kept state, a sixth of every step's time spread over the 25 between saves.
class LibTorchStateCopy : public OptimizerStateCopy {
 public:
  // nullptr when a state is of a kind deep_copy does not know.
  static std::shared_ptr<const LibTorchStateCopy> of(const torch::optim::Optimizer& optimizer,
                                                     TensorRecycler& recycler) {
    auto copy = std::make_shared<LibTorchStateCopy>();
    for (const auto& [key, state] : optimizer.state()) {
      std::unique_ptr<torch::optim::OptimizerParamState> c = deep_copy(*state, recycler);
      if (!c) return nullptr;
      for (const at::Tensor& t : optimizer_state_tensors_of(*c)) copy->bytes_ += size_t(t.nbytes());
      copy->states_.emplace_back(key, std::move(c));
    }
    for (const auto& group : optimizer.param_groups()) copy->options_.push_back(group.options().clone());
    return copy;
  }
  size_t bytes() const override { return bytes_; }
  std::vector<at::Tensor> tensors() const override {
    std::vector<at::Tensor> out;
    for (const auto& [key, state] : states_)
      for (at::Tensor& t : optimizer_state_tensors_of(*state)) out.push_back(std::move(t));
    return out;
  }
  // The kept copy stays as it is: each restore gets copies of its own.
  void restore(torch::optim::Optimizer& optimizer) const {
    optimizer.state().clear();  // state a parameter gained after the save goes too
    TensorRecycler fresh;
    for (const auto& [key, state] : states_) optimizer.state()[key] = deep_copy(*state, fresh);
    for (size_t i = 0; i < options_.size() && i < optimizer.param_groups().size(); ++i)
      optimizer.param_groups()[i].set_options(options_[i]->clone());
  }

 private:
  using Key = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state().begin()->first)>;
  std::vector<std::pair<Key, std::unique_ptr<torch::optim::OptimizerParamState>>> states_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options_;
  size_t bytes_ = 0;
};

}  // namespace

at::Tensor TensorRecycler::copy(const at::Tensor& t, const at::Device& device) {
  if (!t.defined()) return t;
  const at::Tensor source = t.detach();
  at::Tensor spare = next_ < spares_.size() ? std::move(spares_[next_++]) : at::Tensor();
  // Held by nothing else: the copy being replaced let go of it, and no view of it is out.
  const bool fits = spare.defined() && spare.use_count() == 1 && spare.storage().use_count() == 1 &&
                    spare.device() == device && spare.scalar_type() == source.scalar_type() &&
                    spare.sizes() == source.sizes() && spare.is_contiguous() && !spare.requires_grad();
  if (!fits) return source.to(device, /*non_blocking=*/false, /*copy=*/true);
  c10::NoGradGuard no_grad;
  probe::copy_into(spare, source);
  return spare;
}

SavedOptimizer save_optimizer(const torch::optim::Optimizer& optimizer, TensorRecycler* recycler) {
  SavedOptimizer saved;
  TensorRecycler fresh;
  TensorRecycler& memory = recycler ? *recycler : fresh;
  if (const auto* own = dynamic_cast<const CopiesItsState*>(&optimizer))
    saved.copy = own->copy_state(memory);
  else
    saved.copy = LibTorchStateCopy::of(optimizer, memory);
  if (!saved.copy) saved.bytes = optimizer_bytes(optimizer);
  return saved;
}

void restore_optimizer(torch::optim::Optimizer& optimizer, const SavedOptimizer& saved) {
  if (const auto* libtorch = dynamic_cast<const LibTorchStateCopy*>(saved.copy.get()))
    libtorch->restore(optimizer);
  else if (saved.copy)
    dynamic_cast<CopiesItsState&>(optimizer).restore_state(*saved.copy);
  else
    load_optimizer_bytes(optimizer, saved.bytes);
}

void load_optimizer_state_by_name(torch::optim::Optimizer& optimizer, const NamedTensors& parameters,
                                  const NamedTensors& state) {
  std::map<std::string, at::Tensor> slots(state.begin(), state.end());
  auto slot = [&](const std::string& name, const at::Tensor& parameter) {
    auto it = slots.find(name);
    return it == slots.end() ? at::Tensor() : it->second.to(parameter.device());
  };
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  const bool sgd = dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr;
  if (!adamw && !sgd) throw std::invalid_argument("optimizer state can be put back for AdamW and SGD only");
  optimizer.state().clear();
  for (const auto& [name, p] : parameters) {
    if (adamw) {
      const at::Tensor step = slot(name + "/step", p);
      if (!step.defined()) continue;  // no state yet (never stepped)
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(step.item<int64_t>());
      s->exp_avg(slot(name + "/exp_avg", p));
      s->exp_avg_sq(slot(name + "/exp_avg_sq", p));
      if (!s->exp_avg().defined() || !s->exp_avg_sq().defined())
        throw std::invalid_argument("optimizer state of '" + name + "' is incomplete");
      compat::set_param_state(optimizer, p, std::move(s));
    } else if (at::Tensor momentum = slot(name + "/momentum_buffer", p); momentum.defined()) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(momentum);
      compat::set_param_state(optimizer, p, std::move(s));
    }
  }
}

void cast_optimizer_state(torch::optim::Optimizer& optimizer, at::ScalarType dtype) {
  // Only narrower states widen: a float64 model's float64 state stays.
  auto cast = [dtype](const at::Tensor& t) {
    return at::elementSize(t.scalar_type()) < at::elementSize(dtype) ? t.to(dtype) : t;
  };
  for (auto& [key, state] : optimizer.state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      if (adam->exp_avg().defined()) adam->exp_avg(cast(adam->exp_avg()));
      if (adam->exp_avg_sq().defined()) adam->exp_avg_sq(cast(adam->exp_avg_sq()));
      if (adam->max_exp_avg_sq().defined()) adam->max_exp_avg_sq(cast(adam->max_exp_avg_sq()));
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      if (sgd->momentum_buffer().defined()) sgd->momentum_buffer(cast(sgd->momentum_buffer()));
    }
  }
}

void clear_grads(const std::vector<at::Tensor>& parameters) {
  for (const auto& p : parameters) {
    at::Tensor param = p;  // handles share the TensorImpl; mutable_grad() needs a non-const one
    if (param.grad().defined()) param.mutable_grad() = at::Tensor();
  }
}

}  // namespace nanscope
