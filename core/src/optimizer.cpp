#include "nanscope/core/optimizer.hpp"

#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "nanscope/common/torch_compat.hpp"

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

std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(state.get())) {
      for (const auto& t : {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()})
        if (t.defined()) out.push_back(t);
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state.get())) {
      if (sgd->momentum_buffer().defined()) out.push_back(sgd->momentum_buffer());
    }
  }
  return out;
}

NamedTensors optimizer_state_by_name(const torch::optim::Optimizer& optimizer, const NamedTensors& parameters) {
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

SavedOptimizer save_optimizer(const torch::optim::Optimizer& optimizer) {
  SavedOptimizer saved;
  if (const auto* own = dynamic_cast<const CopiesItsState*>(&optimizer))
    saved.copy = own->copy_state();
  else
    saved.bytes = optimizer_bytes(optimizer);
  return saved;
}

void restore_optimizer(torch::optim::Optimizer& optimizer, const SavedOptimizer& saved) {
  if (saved.copy)
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
