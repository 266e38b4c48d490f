#pragma once
// The small models the core and trainer tests share.
#include "nanscope/models/mlp.hpp"

namespace nanscope::test {

inline std::unique_ptr<TrainableModel> tiny_mlp(uint64_t seed = 0) {
  MlpConfig c;
  c.in_features = 8;
  c.hidden = 16;
  c.classes = 4;
  return make_mlp(c, seed);
}

}  // namespace nanscope::test
