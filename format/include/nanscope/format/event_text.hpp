#pragma once
// The texts of the warning and rollback events, written and read here only,
// so the trainer, the viewer and a script agree on what they say
// (docs/format.md shows the same rules for h5py).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"

namespace nanscope::format {

// "layer_grad_norm in 'blocks.0.mlp': 41.2 against 1.3, the precision's limit in about 12 steps"
struct WarningFields {
  std::string signal;  // grad_norm_spike, grad_norm_growth, layer_grad_norm, loss_spike, ...
  std::string where;   // a layer, "inputs", or "" for the whole model
  double value = 0, baseline = 0;
  std::optional<double> steps_to_limit;
};
std::string warning_text(const WarningFields& w);
// The layer (or "inputs") a warning's text names; "" when it names none.
std::string warning_where(const std::string& text);

// "to step 120: steps 121-131 do not count and their batches are skipped; LR x 0.5 -> 0.00015"
// The event's own step is the step that triggered it (the last one rolled back).
struct RollbackFields {
  int64_t to_step = 0;      // the newest good state: the weights as they were after this step
  int64_t failed_step = 0;  // the event's step
  double lr_factor = 1, new_lr = 0;
  std::string why;  // "the weights are non-finite", "loss 3e+09 x 10 the largest healthy loss 2 steps running"
};
std::string rollback_text(const RollbackFields& r);
// The step a rollback event's text says the run went back to; nullopt for a
// text that does not start "to step N".
std::optional<int64_t> rollback_target(const std::string& text);

// The failing step a `doom` event's text is about ("step 45 doomed step 55:
// ...", "no earlier step doomed step 55: ..."); nullopt for another text.
std::optional<int64_t> doomed_step(const std::string& text);

// One entry per row of `run`: 1 where a later rollback took the row's update
// back (its step lies after a rollback's target, up to the rollback's own
// step), 0 for the rows that make up the run's curve.
std::vector<uint8_t> rolled_back_rows(const RunData& run);

}  // namespace nanscope::format
