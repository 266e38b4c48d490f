#pragma once
// A torch.optim optimizer (any of them) as the core's torch::optim::Optimizer:
// the parameter groups are the Python groups' tensors, each group's LR is read
// and written in the Python group (the fallback's and a rollback's LR cut),
// step() is the Python optimizer's step(), and save()/load() carry its
// state_dict(), so rollback states, checkpoints of the guard and snapshots'
// restores keep the user's optimizer state whatever it holds.
#include <torch/csrc/utils/pybind.h>
#include <torch/optim/optimizer.h>

#include "nanscope/core/closure_optimizer.hpp"
#include "nanscope/core/optimizer.hpp"
#include "python_model.hpp"

namespace nanscope::python {

class PythonOptimizer : public torch::optim::Optimizer, public EvaluatesClosure, public CopiesItsState {
 public:
  explicit PythonOptimizer(py::object optimizer);  // throws TypeError for anything else
  // step(closure) hands Python's step a function that runs `closure`; an
  // exception it throws (the guard's end of a non-finite evaluation, the
  // model's own) comes back out of step() as itself.
  at::Tensor step(LossClosure closure = nullptr) override;
  // Its step() takes a closure it cannot do without (torch.optim.LBFGS's).
  bool evaluates_closure() const override { return evaluates_closure_; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // A deep copy of its state_dict(), put back with load_state_dict().
  std::shared_ptr<const OptimizerStateCopy> copy_state(TensorRecycler& recycler) const override;
  void restore_state(const OptimizerStateCopy& copy) override;
  // optimizer.state's tensors ("NAME/exp_avg"...): a sharded state's DTensor
  // by its local shard (each rank checks its own), another tensor subclass
  // left out.
  NamedTensors state_by_name(const NamedTensors& parameters) const override;

 private:
  explicit PythonOptimizer(SharedObject optimizer);
  SharedObject optimizer_;
  bool evaluates_closure_ = false;
};

}  // namespace nanscope::python
