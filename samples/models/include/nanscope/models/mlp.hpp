#pragma once
// A small classifier: fc1 -> GELU -> ln -> fc2 -> GELU -> head, cross-entropy.
#include <memory>

#include "nanscope/core/model.hpp"

namespace nanscope {

struct MlpConfig {
  int64_t in_features = 32;
  int64_t hidden = 128;
  int64_t classes = 8;
};

std::unique_ptr<TrainableModel> make_mlp(const MlpConfig& config, uint64_t seed);
MlpConfig mlp_config_from(const ModelSpec& spec);

}  // namespace nanscope
