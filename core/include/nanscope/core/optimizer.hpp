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

// Copies of tensors written into the memory of earlier copies, in order, where
// one fits (same shape, type and device, and held by nothing else): a kept
// state written into the one it displaces costs a memcpy, where fresh memory
// first faults in every page (a 650,000-parameter Adam's state: tens of
// milliseconds a save). Without spares, or where one does not fit, a new copy.
class TensorRecycler {
 public:
  TensorRecycler() = default;
  explicit TensorRecycler(std::vector<at::Tensor> spares) : spares_(std::move(spares)) {}
  // A copy of `t` on `device` (undefined stays undefined).
  at::Tensor copy(const at::Tensor& t, const at::Device& device);

 private:
  std::vector<at::Tensor> spares_;
  size_t next_ = 0;
};

// An optimizer's state copied by the optimizer itself (CopiesItsState).
class OptimizerStateCopy {
 public:
  virtual ~OptimizerStateCopy() = default;
  virtual size_t bytes() const = 0;  // memory held
  // The copy's tensors, which a later copy may be written into (TensorRecycler); none by default.
  virtual std::vector<at::Tensor> tensors() const { return {}; }
};
// An optimizer whose state lives outside LibTorch's per-parameter maps, and
// copies faster than it serializes, derives from this as well: Python's
// adapter copies its state_dict(), where a torch.save into bytes for every
// kept state cost a small model's step a tenth of a millisecond, spread over
// the steps between two saves.
class CopiesItsState {
 public:
  virtual ~CopiesItsState() = default;
  // `recycler`: the memory of the copy this one displaces.
  virtual std::shared_ptr<const OptimizerStateCopy> copy_state(TensorRecycler& recycler) const = 0;
  virtual void restore_state(const OptimizerStateCopy& copy) = 0;
  // Its per-parameter state's tensors, as optimizer_state_by_name() names them.
  virtual NamedTensors state_by_name(const NamedTensors& parameters) const = 0;
};
// The state of any optimizer, kept in memory to be put back: its own copy
// where it makes one, else its serialization.
struct SavedOptimizer {
  std::string bytes;
  std::shared_ptr<const OptimizerStateCopy> copy;
  size_t size() const { return copy ? copy->bytes() : bytes.size(); }
};
// `recycler`: the memory of a state this one displaces.
SavedOptimizer save_optimizer(const torch::optim::Optimizer& optimizer, TensorRecycler* recycler = nullptr);
void restore_optimizer(torch::optim::Optimizer& optimizer, const SavedOptimizer& saved);
// The fp32 fallback casts the optimizer state with the model.
void cast_optimizer_state(torch::optim::Optimizer& optimizer, at::ScalarType dtype);
// Drops gradients (set_to_none): a skipped step leaves no trace in .grad.
void clear_grads(const std::vector<at::Tensor>& parameters);

}  // namespace nanscope
