#include "python_optimizer.hpp"

#include <torch/serialize/archive.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace nanscope::python {

namespace {

// One Python parameter group's options: its LR lives in the Python dict,
// looked up by index each time (load_state_dict replaces the group dicts).
class PythonGroupOptions : public torch::optim::OptimizerCloneableOptions<PythonGroupOptions> {
 public:
  PythonGroupOptions(SharedObject optimizer, size_t index) : optimizer_(std::move(optimizer)), index_(index) {}
  double get_lr() const override {
    py::gil_scoped_acquire gil;
    return group()["lr"].cast<double>();
  }
  void set_lr(const double lr) override {
    py::gil_scoped_acquire gil;
    group()["lr"] = lr;
  }

 private:
  py::object group() const { return optimizer_->attr("param_groups")[py::int_(index_)]; }
  SharedObject optimizer_;
  size_t index_;
};

const py::object& checked(const py::object& optimizer) {
  if (!py::hasattr(optimizer, "param_groups") || !py::hasattr(optimizer, "state_dict"))
    throw py::type_error("nanscope.StepGuard: optimizer must be a torch.optim.Optimizer (got " +
                         py::repr(optimizer).cast<std::string>() + ")");
  return optimizer;
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(const SharedObject& optimizer) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  size_t index = 0;
  for (const py::handle group : optimizer->attr("param_groups")) {
    std::vector<at::Tensor> params;
    for (const py::handle p : group["params"]) params.push_back(p.cast<at::Tensor>());
    groups.emplace_back(std::move(params), std::make_unique<PythonGroupOptions>(optimizer, index++));
  }
  return groups;
}

}  // namespace

PythonOptimizer::PythonOptimizer(py::object optimizer) : PythonOptimizer(share(checked(optimizer))) {}

PythonOptimizer::PythonOptimizer(SharedObject optimizer)
    : torch::optim::Optimizer(groups_of(optimizer), std::make_unique<PythonGroupOptions>(optimizer, 0)),
      optimizer_(std::move(optimizer)) {}

at::Tensor PythonOptimizer::step(LossClosure /*closure*/) {
  py::gil_scoped_acquire gil;
  optimizer_->attr("step")();
  return {};
}

// The state_dict through torch.save: a copy, as a rollback state needs.
void PythonOptimizer::save(torch::serialize::OutputArchive& archive) const {
  py::gil_scoped_acquire gil;
  py::object io = py::module_::import("io").attr("BytesIO")();
  py::module_::import("torch").attr("save")(optimizer_->attr("state_dict")(), io);
  const std::string bytes = io.attr("getvalue")().cast<std::string>();
  archive.write("python_state_dict",
                at::from_blob(const_cast<char*>(bytes.data()), {int64_t(bytes.size())}, at::kByte).clone());
}

void PythonOptimizer::load(torch::serialize::InputArchive& archive) {
  at::Tensor bytes;
  archive.read("python_state_dict", bytes);
  py::gil_scoped_acquire gil;
  const py::bytes data(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), size_t(bytes.numel()));
  py::object io = py::module_::import("io").attr("BytesIO")(data);
  optimizer_->attr("load_state_dict")(py::module_::import("torch").attr("load")(io));
}

}  // namespace nanscope::python
