#pragma once
// Small models and options shared by the trainer tests.
#include "nanscope/core/models/mlp.hpp"
#include "options.hpp"

namespace nanscope::test {

inline std::unique_ptr<TrainableModel> tiny_mlp(uint64_t seed = 0) {
  MlpConfig c;
  c.in_features = 8;
  c.hidden = 16;
  c.classes = 4;
  return make_mlp(c, seed);
}

inline TrainOptions quick_mlp_run(const std::string& run_dir, int64_t steps) {
  TrainOptions o;
  o.model = "mlp";
  o.steps = steps;
  o.batch_size = 32;
  o.lr = 1e-3;
  o.hidden = 32;
  o.run_dir = run_dir;
  o.quiet = true;
  o.threads = 1;
  return o;
}

}  // namespace nanscope::test
