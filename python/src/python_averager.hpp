#pragma once
// Data parallel through the user's own torch.distributed process group: the
// guard's one all-reduce per step (gradients averaged, flags reduced with MAX)
// is a Python function the nanscope package builds for that group, so every
// rank agrees on each skip, rollback and stop.
#include <torch/csrc/utils/pybind.h>

#include "nanscope/core/gradient_averager.hpp"
#include "python_model.hpp"

namespace nanscope::python {

class PythonAverager : public GradientAverager {
 public:
  // average(flags): averages the parameters' .grad over the group (or leaves
  // them, when DistributedDataParallel did it in backward) and all-reduces
  // `flags` with MAX, in place.
  PythonAverager(py::object average, int rank, int world_size)
      : average_(share(std::move(average))), rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  void average(const at::Tensor& flags) override {
    py::gil_scoped_acquire gil;
    (*average_)(flags);
  }

 private:
  SharedObject average_;
  int rank_, world_size_;
};

}  // namespace nanscope::python
