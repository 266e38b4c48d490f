#pragma once
// The options of a quick nanscope-train run the trainer tests share.
#include "../support/tiny_models.hpp"
#include "nanscope/trainer/options.hpp"

namespace nanscope::test {

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
