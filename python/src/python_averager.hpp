#pragma once
// Data parallel through the user's own torch.distributed process group: the
// guard's one collective per step is a Python object the nanscope package
// builds for that group (nanscope/_distributed.py), so every rank agrees on
// each skip, rollback and stop.
#include <torch/csrc/utils/pybind.h>

#include "nanscope/core/gradient_averager.hpp"
#include "python_model.hpp"

namespace nanscope::python {

class PythonAverager : public GradientAverager {
 public:
  // `ranks`: average(flags) averages the parameters' .grad over the group (or
  // leaves them, when DistributedDataParallel did it in backward) and sums
  // `flags` in place (or waits for their sum, begun in DDP's last bucket or by
  // begin_average); own_gradients_nonfinite() is
  // DistributedDataParallel's note of this rank's gradients before they mixed
  // (None where the guard averages them); sum(values) all-reduces with SUM
  // (or waits for the sum begin_sum(values) started);
  // sharded is True for a sharded model (FSDP).
  PythonAverager(py::object ranks, int rank, int world_size)
      : ranks_(share(std::move(ranks))), rank_(rank), world_size_(world_size) {
    py::gil_scoped_acquire gil;
    sharded_ = ranks_->attr("sharded").cast<bool>();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  void average(const at::Tensor& flags) override {
    py::gil_scoped_acquire gil;
    ranks_->attr("average")(flags);
  }
  void begin_average(const at::Tensor& flags) override {
    py::gil_scoped_acquire gil;
    ranks_->attr("begin_average")(flags);
  }
  at::Tensor own_gradients_nonfinite() override {
    py::gil_scoped_acquire gil;
    py::object own = ranks_->attr("own_gradients_nonfinite")();
    return own.is_none() ? at::Tensor() : own.cast<at::Tensor>();
  }
  bool sharded() const override { return sharded_; }
  bool sums() const override { return true; }
  void sum(const at::Tensor& values) override {
    py::gil_scoped_acquire gil;
    ranks_->attr("sum")(values);
  }
  void begin_sum(const at::Tensor& values) override {
    py::gil_scoped_acquire gil;
    ranks_->attr("begin_sum")(values);
  }

 private:
  SharedObject ranks_;
  int rank_, world_size_;
  bool sharded_ = false;
};

}  // namespace nanscope::python
