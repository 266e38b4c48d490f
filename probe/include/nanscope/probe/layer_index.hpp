#pragma once
// Layers for telemetry are the modules that own parameters: "blocks.0.attn.qkv"
// owns blocks.0.attn.qkv.weight and .bias. This maps each parameter to its
// layer so per-layer norms can be folded from per-parameter norms on the host.
#include <cstdint>
#include <string>
#include <vector>

namespace nanscope::probe {

class LayerIndex {
 public:
  // Parameter names in the order the gradients will be given.
  explicit LayerIndex(const std::vector<std::string>& parameter_names);

  const std::vector<std::string>& layer_names() const { return layer_names_; }
  size_t layer_of(size_t parameter) const { return layer_of_[parameter]; }
  size_t parameter_count() const { return layer_of_.size(); }

  // sqrt(sum of squares) of each layer's parameter norms. A NaN/Inf stays in
  // the layers it came from, so the table shows where a bad gradient lives.
  std::vector<float> fold_norms(const float* parameter_norms) const;

  // "blocks.0.attn.qkv.weight" -> "blocks.0.attn.qkv"; "scale" -> "" (the root).
  static std::string owner_of(const std::string& parameter_name);

 private:
  std::vector<std::string> layer_names_;
  std::vector<size_t> layer_of_;
};

}  // namespace nanscope::probe
