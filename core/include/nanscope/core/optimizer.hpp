#pragma once
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/model.hpp"

namespace nanscope {

void set_lr(torch::optim::Optimizer& optimizer, double lr);
// Every parameter group's LR times `factor` (groups keep their ratios).
void scale_lr(torch::optim::Optimizer& optimizer, double factor);
// Each group's LR as the scope found it, put back when it ends. The groups'
// LR is the loop's (a schedule's, or set by hand each iteration): whatever
// the guard sets for one update, a replay or a restored state, the loop's
// stays.
class GroupLrScope {
 public:
  explicit GroupLrScope(torch::optim::Optimizer& optimizer);
  ~GroupLrScope();
  GroupLrScope(const GroupLrScope&) = delete;
  GroupLrScope& operator=(const GroupLrScope&) = delete;
  // For the scope: each group's LR times `multiplier`; or set to `lrs` (the
  // first lrs.size() groups).
  void scale(double multiplier);
  void set(const std::vector<double>& lrs);
  const std::vector<double>& kept() const { return kept_; }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<double> kept_;
};
// Each group's LR.
std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer);
// Every tensor of the optimizer's per-parameter state (exp_avg, momentum...).
std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer);
// The state of each named parameter's slots, as "NAME/exp_avg", "NAME/step"...
// (the optimizer's own tensors, not copies: writing them out costs no memory).
NamedTensors optimizer_state_by_name(const torch::optim::Optimizer& optimizer, const NamedTensors& parameters);
// Puts such state back, each slot on its parameter's device (AdamW and SGD,
// nanscope-train's optimizers; throws std::invalid_argument for another).
void load_optimizer_state_by_name(torch::optim::Optimizer& optimizer, const NamedTensors& parameters,
                                  const NamedTensors& state);
// The optimizer's whole state (param groups' options and per-parameter
// slots) through its own serialization, as bytes, and back: what the state
// ring and resumable checkpoints keep. Works for any torch::optim optimizer.
std::string optimizer_bytes(const torch::optim::Optimizer& optimizer);
void load_optimizer_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes);

// An optimizer's state copied by the optimizer itself (CopiesItsState).
class OptimizerStateCopy {
 public:
  virtual ~OptimizerStateCopy() = default;
  virtual size_t bytes() const = 0;  // memory held
};
// An optimizer whose state copies faster than it serializes derives from this
// as well: Python's adapter deep-copies its state_dict(), where a torch.save
// into bytes for every kept state cost a small model's step a tenth of a
// millisecond, spread over the steps between two saves.
class CopiesItsState {
 public:
  virtual ~CopiesItsState() = default;
  virtual std::shared_ptr<const OptimizerStateCopy> copy_state() const = 0;
  virtual void restore_state(const OptimizerStateCopy& copy) = 0;
};
// The state of any optimizer, kept in memory to be put back: its own copy
// where it makes one, else its serialization.
struct SavedOptimizer {
  std::string bytes;
  std::shared_ptr<const OptimizerStateCopy> copy;
  size_t size() const { return copy ? copy->bytes() : bytes.size(); }
};
SavedOptimizer save_optimizer(const torch::optim::Optimizer& optimizer);
void restore_optimizer(torch::optim::Optimizer& optimizer, const SavedOptimizer& saved);
// The fp32 fallback casts the optimizer state with the model.
void cast_optimizer_state(torch::optim::Optimizer& optimizer, at::ScalarType dtype);
// Drops gradients (set_to_none): a skipped step leaves no trace in .grad.
void clear_grads(const std::vector<at::Tensor>& parameters);

}  // namespace nanscope
