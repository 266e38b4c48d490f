#include "nanscope/core/state_health.hpp"

#include <c10/core/GradMode.h>

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

std::string StateHealth::text() const {
  constexpr size_t kShown = 3;
  std::string out;
  for (size_t i = 0; i < nonfinite.size() && i < kShown; ++i) out += (i ? ", " : "") + nonfinite[i];
  if (nonfinite.size() > kShown) out += " and " + std::to_string(nonfinite.size() - kShown) + " more";
  return out;
}

StateHealth state_health(const TrainableModel& model, const torch::optim::Optimizer* optimizer) {
  c10::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<at::Tensor> flags;
  // healthy(t): every value finite, or (a buffer) no NaN.
  auto check = [&](const char* what, const NamedTensors& tensors, bool infinities_allowed) {
    for (const auto& [name, t] : tensors) {
      if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) continue;
      names.push_back(std::string(what) + " " + name);
      const at::Tensor healthy = infinities_allowed ? at::logical_not(at::isnan(t).any()) : at::isfinite(t).all();
      flags.push_back(healthy.reshape({1}).to(at::kCPU));
    }
  };
  const NamedTensors parameters = model.named_parameters();
  check("parameter", parameters, false);
  check("buffer", model.named_buffers(), true);
  if (optimizer) check("optimizer state", optimizer_state_by_name(*optimizer, model.trainable_parameters()), false);
  StateHealth health;
  if (flags.empty()) return health;
  const at::Tensor all = at::cat(flags);
  const bool* ok = all.data_ptr<bool>();
  for (size_t i = 0; i < names.size(); ++i)
    if (!ok[i]) health.nonfinite.push_back(names[i]);
  return health;
}

}  // namespace nanscope
