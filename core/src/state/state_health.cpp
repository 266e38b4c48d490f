#include "nanscope/core/state_health.hpp"

#include <c10/core/GradMode.h>

#include "nanscope/common/list_text.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/probe/finiteness.hpp"

namespace nanscope {

std::string StateHealth::text() const { return first_few_text(nonfinite); }

std::vector<std::string> nonfinite_parameters(const TrainableModel& model) {
  c10::NoGradGuard no_grad;
  std::vector<std::string> names, sick;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, t] : model.named_parameters()) {
    if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
    names.push_back(name);
    tensors.push_back(t);
  }
  if (tensors.empty()) return sick;
  const at::Tensor finite = probe::finite_each(tensors).to(at::kCPU);
  const bool* ok = finite.data_ptr<bool>();
  for (size_t i = 0; i < names.size(); ++i)
    if (!ok[i]) sick.push_back(names[i]);
  return sick;
}

StateHealth state_health(const TrainableModel& model, const torch::optim::Optimizer* optimizer) {
  c10::NoGradGuard no_grad;
  std::vector<std::string> names;
  // Healthy: every value finite (probe::finite_each, for all of them at
  // once), or, for a buffer, no NaN (a mask holds -inf).
  std::vector<at::Tensor> strict, lenient;
  std::vector<bool> is_strict;
  auto check = [&](const char* what, const NamedTensors& tensors, bool infinities_allowed) {
    for (const auto& [name, t] : tensors) {
      if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
      names.push_back(std::string(what) + " " + name);
      is_strict.push_back(!infinities_allowed);
      if (infinities_allowed)
        lenient.push_back(at::logical_not(at::isnan(t).any()).reshape({1}).to(at::kCPU));
      else
        strict.push_back(t);
    }
  };
  const NamedTensors parameters = model.named_parameters();
  check("parameter", parameters, false);
  check("buffer", model.named_buffers(), true);
  if (optimizer) check("optimizer state", optimizer_state_by_name(*optimizer, model.trainable_parameters()), false);
  StateHealth health;
  if (names.empty()) return health;
  std::vector<at::Tensor> flags = std::move(lenient);
  if (!strict.empty()) flags.push_back(probe::finite_each(strict).to(at::kCPU));
  // The lenient flags first, then the strict ones, each in the order met.
  const at::Tensor all = at::cat(flags);
  const bool* ok = all.data_ptr<bool>();
  const size_t lenient_count = size_t(all.numel()) - strict.size();
  size_t next_lenient = 0, next_strict = lenient_count;
  for (size_t i = 0; i < names.size(); ++i)
    if (!ok[is_strict[i] ? next_strict++ : next_lenient++]) health.nonfinite.push_back(names[i]);
  return health;
}

}  // namespace nanscope
