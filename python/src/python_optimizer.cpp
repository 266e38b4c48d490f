#include "python_optimizer.hpp"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
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

// Whether step() requires a closure: a `closure` parameter with no default.
bool requires_closure(const py::object& optimizer) {
  try {
    const py::object parameters =
        py::module_::import("inspect").attr("signature")(optimizer.attr("step")).attr("parameters");
    if (!parameters.contains("closure")) return false;
    return parameters["closure"].attr("default").is(py::module_::import("inspect").attr("Parameter").attr("empty"));
  } catch (const py::error_already_set&) {
    return false;  // no signature to read (a builtin): steps without one
  }
}

PythonOptimizer::PythonOptimizer(SharedObject optimizer)
    : torch::optim::Optimizer(groups_of(optimizer), std::make_unique<PythonGroupOptions>(optimizer, 0)),
      optimizer_(std::move(optimizer)),
      evaluates_closure_(requires_closure(*optimizer_)) {}

at::Tensor PythonOptimizer::step(LossClosure closure) {
  py::gil_scoped_acquire gil;
  if (!closure) {
    optimizer_->attr("step")();
    return {};
  }
  // A C++ exception cannot cross Python's frames as itself: kept here, a
  // Python error unwinds the optimizer's step, and the kept one goes on.
  std::exception_ptr thrown;
  py::cpp_function evaluate([&]() -> at::Tensor {
    try {
      py::gil_scoped_release released;  // the core's evaluation runs backward (and takes the GIL where it needs it)
      return closure();
    } catch (...) {
      thrown = std::current_exception();
    }
    PyErr_SetString(PyExc_RuntimeError, "nanscope: the guard ended the optimizer's step");
    throw py::error_already_set();
  });
  try {
    py::object loss = optimizer_->attr("step")(evaluate);
    return loss.is_none() ? at::Tensor() : loss.cast<at::Tensor>();
  } catch (const py::error_already_set&) {
    if (thrown) std::rethrow_exception(thrown);
    throw;
  }
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

namespace {

class PythonStateCopy : public OptimizerStateCopy {
 public:
  PythonStateCopy(SharedObject state, size_t bytes) : state_(std::move(state)), bytes_(bytes) {}
  size_t bytes() const override { return bytes_; }
  const py::object& state() const { return *state_; }

 private:
  SharedObject state_;
  size_t bytes_;
};

// optimizer.state_dict() with every tensor of its per-parameter state cloned
// (each by its own clone(): a sharded state's DTensor stays one) and the rest
// deep-copied; `bytes` adds up the clones. copy.deepcopy of the whole took a
// small AdamW 1.5 ms, most of it deepcopy's own bookkeeping per tensor.
py::dict copied_state_dict(const py::object& optimizer, size_t& bytes) {
  const py::object deepcopy = py::module_::import("copy").attr("deepcopy");
  const py::dict whole = optimizer.attr("state_dict")();
  py::dict out;
  for (const auto& [key, value] : whole)
    if (key.cast<std::string>() != "state") out[key] = deepcopy(value);
  py::dict state;
  for (const auto& [index, slots] : whole["state"].cast<py::dict>()) {
    py::dict copy;
    for (const auto& [name, value] : slots.cast<py::dict>()) {
      if (!THPVariable_Check(value.ptr())) {
        copy[name] = deepcopy(value);
        continue;
      }
      const at::Tensor t = value.cast<at::Tensor>();
      bytes += size_t(t.numel()) * t.element_size();
      copy[name] = value.attr("detach")().attr("clone")();
    }
    state[index] = copy;
  }
  out["state"] = state;
  return out;
}

}  // namespace

std::shared_ptr<const OptimizerStateCopy> PythonOptimizer::copy_state() const {
  py::gil_scoped_acquire gil;
  size_t bytes = 0;
  py::object copy = copied_state_dict(*optimizer_, bytes);
  return std::make_shared<PythonStateCopy>(share(std::move(copy)), bytes);
}

void PythonOptimizer::restore_state(const OptimizerStateCopy& copy) {
  py::gil_scoped_acquire gil;
  // load_state_dict keeps the tensors it is given (torch 2): the kept copy
  // must stay as it is for a later rollback to the same state.
  const py::object& kept = dynamic_cast<const PythonStateCopy&>(copy).state();
  optimizer_->attr("load_state_dict")(py::module_::import("copy").attr("deepcopy")(kept));
}

}  // namespace nanscope::python
