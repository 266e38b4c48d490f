#include "nanscope/core/fp32_modules.hpp"

#include <algorithm>

#include "nanscope/probe/float_types.hpp"

namespace nanscope {

Fp32ModuleRegions::Fp32ModuleRegions(const TrainableModel& model, std::vector<std::string> modules) {
  if (modules.empty()) return;
  if (model.is_torchscript())
    scripted_.emplace(std::move(modules));
  else
    native_.emplace(std::move(modules));
}

bool Fp32ModuleRegions::switchable() const { return !scripted_ || scripted_->entered(); }

std::vector<std::string> Fp32ModuleRegions::not_entered() const {
  if (native_) return native_->not_entered();
  if (scripted_) return scripted_->not_entered();
  return {};
}

std::vector<Module16Bit> modules_of_16bit_weights(const TrainableModel& model,
                                                  const std::vector<std::string>& modules) {
  std::vector<Module16Bit> out;
  if (modules.empty()) return out;
  const NamedTensors parameters = model.all_named_parameters();
  for (const std::string& module : modules)
    for (const auto& [name, p] : parameters) {
      const bool owned = module.empty() || name.rfind(module + ".", 0) == 0;
      if (owned && probe::is_16bit_float(p.scalar_type())) {
        out.push_back({module, name, probe::float_type_name(p.scalar_type())});
        break;
      }
    }
  return out;
}

namespace {

size_t depth(const std::string& module) { return size_t(std::count(module.begin(), module.end(), '.')); }

}  // namespace

std::vector<std::string> minimal_fp32_modules(Fp32Trial& trial, const std::string& birth_module) {
  std::vector<std::string> candidates = trial.modules();
  if (candidates.empty()) return {};
  // One module is the smallest set there is. (Single regions also avoid a
  // trap of nesting: a region inside an autocast region receives
  // low-precision inputs its fp32 ops may reject.)
  std::vector<std::string> singles = candidates;
  std::stable_sort(singles.begin(), singles.end(),
                   [](const std::string& a, const std::string& b) { return depth(a) > depth(b); });
  if (auto it = std::find(singles.begin(), singles.end(), birth_module); it != singles.end())
    std::rotate(singles.begin(), it, it + 1);
  for (const auto& module : singles) {
    if (trial.unswitchable()) return {};
    if (trial.finite_with({module})) return {module};
  }
  if (!trial.finite_with(candidates)) return {};
  // Greedy 1-minimisation, outer modules first, so the innermost modules that matter remain.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const std::string& a, const std::string& b) { return depth(a) < depth(b); });
  std::vector<std::string> kept = candidates;
  for (const auto& module : candidates) {
    if (trial.unswitchable()) return {};
    std::vector<std::string> without;
    for (const auto& m : kept)
      if (m != module) without.push_back(m);
    if (trial.finite_with(without)) kept = without;
  }
  return kept;
}

}  // namespace nanscope
