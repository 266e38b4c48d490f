#include "nanscope/probe/layer_index.hpp"

#include <cmath>
#include <unordered_map>

namespace nanscope::probe {

std::string LayerIndex::owner_of(const std::string& parameter_name) {
  const auto dot = parameter_name.rfind('.');
  return dot == std::string::npos ? std::string() : parameter_name.substr(0, dot);
}

LayerIndex::LayerIndex(const std::vector<std::string>& parameter_names) {
  std::unordered_map<std::string, size_t> seen;
  layer_of_.reserve(parameter_names.size());
  for (const auto& name : parameter_names) {
    const std::string owner = owner_of(name);
    auto [it, inserted] = seen.emplace(owner, layer_names_.size());
    if (inserted) layer_names_.push_back(owner);
    layer_of_.push_back(it->second);
  }
}

std::vector<float> LayerIndex::fold_norms(const float* parameter_norms) const {
  std::vector<double> sums(layer_names_.size(), 0.0);
  for (size_t p = 0; p < layer_of_.size(); ++p) {
    const double n = parameter_norms[p];
    sums[layer_of_[p]] += n * n;
  }
  std::vector<float> out(sums.size());
  for (size_t l = 0; l < sums.size(); ++l) out[l] = static_cast<float>(std::sqrt(sums[l]));
  return out;
}

}  // namespace nanscope::probe
