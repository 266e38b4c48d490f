#include "nanscope/core/native_model.hpp"

#include <stdexcept>

#include <algorithm>
#include <unordered_set>

#include "nanscope/probe/float_types.hpp"
#include "nanscope/probe/tensor_owners.hpp"

namespace nanscope {

NamedTensors TrainableModel::own_named_parameters() const {
  NamedTensors unique;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (auto& [name, tensor] : all_named_parameters())
    if (seen.insert(tensor.unsafeGetTensorImpl()).second) unique.emplace_back(std::move(name), std::move(tensor));
  return unique;
}

namespace {

NamedTensors with_tensors(NamedTensors named, const NamedTensors& more, bool trainable_only) {
  for (const auto& [name, t] : more)
    if (!trainable_only || t.requires_grad()) named.emplace_back(name, t);
  return named;
}

}  // namespace

NamedTensors TrainableModel::named_parameters() const {
  return with_tensors(own_named_parameters(), optimizer_tensors_, false);
}

NamedTensors TrainableModel::gathered_parameters() {
  return with_tensors(own_gathered_parameters(), optimizer_tensors_, false);
}

NamedTensors TrainableModel::trainable_parameters() const {
  return with_tensors(own_trainable_parameters(), optimizer_tensors_, true);
}

void TrainableModel::add_optimizer_tensors(const NamedTensors& tensors) {
  optimizer_tensors_.insert(optimizer_tensors_.end(), tensors.begin(), tensors.end());
}

NamedTensors optimizer_tensors_outside(const std::vector<std::vector<at::Tensor>>& groups, const NamedTensors& held) {
  std::unordered_set<const c10::TensorImpl*> own;
  for (const auto& [name, t] : held) own.insert(t.unsafeGetTensorImpl());
  NamedTensors out;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].size(); ++i)
      if (own.insert(groups[g][i].unsafeGetTensorImpl()).second)
        out.emplace_back(kOptimizerTensors + std::to_string(g) + "." + std::to_string(i), groups[g][i]);
  return out;
}

void TrainableModel::to(at::Device device, at::ScalarType float_type) {
  torch::NoGradGuard no_grad;
  auto move = [&](at::Tensor& t) {
    const at::ScalarType type = at::isFloatingType(t.scalar_type()) ? float_type : t.scalar_type();
    // set_data keeps the tensor object, which the optimizer and the module share.
    if (t.device() != device || t.scalar_type() != type) t.set_data(t.to(device, type));
  };
  for (auto& [name, p] : all_named_parameters()) move(p);
  for (auto& [name, b] : named_buffers()) move(b);
}

void TrainableModel::widen_to_fp32() {
  torch::NoGradGuard no_grad;
  auto widen = [](at::Tensor& t) {
    if (probe::is_16bit_float(t.scalar_type()))
      t.set_data(t.to(at::kFloat));  // set_data: the optimizer and module share the tensor
  };
  for (auto& [name, p] : all_named_parameters()) widen(p);
  for (auto& [name, b] : named_buffers()) widen(b);
}

at::ScalarType TrainableModel::own_float_type() const {
  for (const auto& [name, p] : all_named_parameters())
    if (at::isFloatingType(p.scalar_type())) return p.scalar_type();
  return at::kFloat;
}

std::string TrainableModel::own_float_type_name() const { return probe::float_type_name(own_float_type()); }

std::string TrainableModel::own_16bit_type_name() const {
  const at::ScalarType own = own_float_type();
  return probe::is_16bit_float(own) ? own_float_type_name() : std::string();
}

std::vector<std::string> TrainableModel::module_paths() const {
  std::vector<std::string> paths{""};
  auto add_owners = [&](const NamedTensors& tensors) {
    for (const auto& [name, t] : tensors)
      for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
        if (std::find(paths.begin(), paths.end(), name.substr(0, dot)) == paths.end())
          paths.push_back(name.substr(0, dot));
  };
  add_owners(all_named_parameters());
  add_owners(named_buffers());
  return paths;
}

at::Tensor TrainableModel::loss(const Batch& batch) {
  if (batch.is_nested())
    throw std::invalid_argument("this model takes a batch of (inputs, targets), not a nested batch");
  return loss(batch.inputs, batch.targets);
}

int64_t TrainableModel::parameter_count() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

NamedTensors TrainableModel::own_trainable_parameters() const {
  NamedTensors out;
  for (auto& [name, p] : own_named_parameters())
    if (p.requires_grad()) out.emplace_back(name, p);
  return out;
}

void read_hparam(const ModelSpec& spec, const char* key, int64_t& out) {
  if (auto it = spec.hparams.find(key); it != spec.hparams.end()) out = it->second;
}

void TrainableModel::add_other_model(const std::string& label, const NamedTensors& parameters,
                                     const NamedTensors& buffers) {
  if (label.empty() || label.find('.') != std::string::npos)
    throw std::invalid_argument("another model's label must be a name without dots, not '" + label + "'");
  if (std::find(other_labels_.begin(), other_labels_.end(), label) != other_labels_.end())
    throw std::invalid_argument("another model labelled '" + label + "' was given already");
  other_labels_.push_back(label);
  for (const auto& [name, t] : parameters) other_parameters_.emplace_back(label + "." + name, t);
  for (const auto& [name, t] : buffers) other_buffers_.emplace_back(label + "." + name, t);
}

void register_tensor_owners(const TrainableModel& model) {
  NamedTensors owned;
  if (!model.is_torchscript()) {
    owned = model.all_named_parameters();
    for (auto& named : model.named_buffers()) owned.push_back(std::move(named));
  }
  for (const NamedTensors* others : {&model.other_parameters(), &model.other_buffers()})
    for (const auto& [name, t] : *others) owned.emplace_back(kOutsideTheModel + name, t);
  if (!owned.empty()) probe::register_tensor_owners(owned);
}

std::vector<at::Tensor> trainable_tensors(const TrainableModel& model) {
  std::vector<at::Tensor> out;
  for (auto& [name, p] : model.trainable_parameters()) out.push_back(p);
  if (out.empty()) throw std::invalid_argument("the model has no trainable parameters");
  return out;
}

NamedTensors NativeModel::all_named_parameters() const {
  NamedTensors out;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

NamedTensors NativeModel::named_buffers() const {
  NamedTensors out;
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::string> NativeModel::module_paths() const {
  std::vector<std::string> out{""};
  // Without the module itself: named_modules() would need it held by a shared_ptr.
  for (const auto& item : module_->named_modules("", /*include_self=*/false)) out.push_back(item.key());
  return out;
}

void NativeModel::set_training(bool on) { module_->train(on); }

}  // namespace nanscope
