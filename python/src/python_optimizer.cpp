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

// An optimizer's state_dict(), copied. Its plain tensors' copies are held in
// C++ alone, never as Python objects: torch 2 keeps a tensor's Python object
// alive as long as the tensor, holding it too, and a later copy could then
// never be written into their memory (TensorRecycler). The rest is a Python
// copy of the state_dict() with None where each plain tensor goes.
class PythonStateCopy : public OptimizerStateCopy {
 public:
  PythonStateCopy(SharedObject rest, SharedObject plain_slots, std::vector<at::Tensor> plain, size_t bytes)
      : rest_(std::move(rest)), plain_slots_(std::move(plain_slots)), plain_(std::move(plain)), bytes_(bytes) {}
  size_t bytes() const override { return bytes_; }
  std::vector<at::Tensor> tensors() const override { return plain_; }
  // A state_dict() of its own for load_state_dict, which keeps the tensors it
  // is given (torch 2): the kept copy stays as it is for a later rollback.
  py::object state_dict() const {
    py::object out = py::module_::import("copy").attr("deepcopy")(*rest_);
    const py::list slots = *plain_slots_;
    for (size_t i = 0; i < plain_.size(); ++i) {
      const py::tuple slot = slots[i];
      out["state"][slot[0]][slot[1]] = py::cast(plain_[i].clone());
    }
    return out;
  }

 private:
  SharedObject rest_;
  SharedObject plain_slots_;  // (parameter index, slot name) of each plain tensor
  std::vector<at::Tensor> plain_;
  size_t bytes_;
};

// optimizer.state_dict(), copied: a plain tensor of its per-parameter state
// is written into the memory of the state this one displaces where it fits
// (`recycler`: a small AdamW's state took 83 us so against 227 us cloned), a
// tensor subclass by its own clone() (a sharded state's DTensor stays one),
// and the rest deep-copied. copy.deepcopy of the whole took a small AdamW
// 1.5 ms, most of it deepcopy's own bookkeeping per tensor.
std::shared_ptr<const PythonStateCopy> copied_state_dict(const py::object& optimizer, TensorRecycler& recycler) {
  const py::object deepcopy = py::module_::import("copy").attr("deepcopy");
  const py::dict whole = optimizer.attr("state_dict")();
  py::dict rest;
  for (const auto& [key, value] : whole)
    if (key.cast<std::string>() != "state") rest[key] = deepcopy(value);
  py::dict state;
  py::list plain_slots;
  std::vector<at::Tensor> plain;
  size_t bytes = 0;
  for (const auto& [index, slots] : whole["state"].cast<py::dict>()) {
    py::dict copy;
    for (const auto& [name, value] : slots.cast<py::dict>()) {
      if (!THPVariable_Check(value.ptr())) {
        copy[name] = deepcopy(value);
        continue;
      }
      const at::Tensor t = value.cast<at::Tensor>();
      bytes += size_t(t.numel()) * t.element_size();
      if (!THPVariable_CheckExact(value.ptr())) {
        copy[name] = value.attr("detach")().attr("clone")();
        continue;
      }
      copy[name] = py::none();  // the copy's place, kept in the dict's order
      plain_slots.append(py::make_tuple(index, name));
      plain.push_back(recycler.copy(t, t.device()));
    }
    state[index] = copy;
  }
  rest["state"] = state;
  return std::make_shared<PythonStateCopy>(share(std::move(rest)), share(std::move(plain_slots)), std::move(plain),
                                           bytes);
}

}  // namespace

std::shared_ptr<const OptimizerStateCopy> PythonOptimizer::copy_state(TensorRecycler& recycler) const {
  py::gil_scoped_acquire gil;
  return copied_state_dict(*optimizer_, recycler);
}

NamedTensors PythonOptimizer::state_by_name(const NamedTensors& parameters) const {
  py::gil_scoped_acquire gil;
  // optimizer.state is keyed by the parameters themselves; a sharded model's
  // are DTensors, and the guard steers their local shards: each state is
  // found by either.
  py::dict by_tensor;
  for (const auto& [key, slots] : optimizer_->attr("state").cast<py::dict>()) {
    by_tensor[key] = slots;
    if (py::hasattr(key, "_local_tensor")) by_tensor[key.attr("_local_tensor")] = slots;
  }
  NamedTensors out;
  for (const auto& [name, parameter] : parameters) {
    const py::object slots = by_tensor.attr("get")(py::cast(parameter));
    if (!py::isinstance<py::dict>(slots)) continue;
    for (const auto& [slot, value] : slots.cast<py::dict>()) {
      py::object plain = py::reinterpret_borrow<py::object>(value);
      if (THPVariable_Check(value.ptr()) && !THPVariable_CheckExact(value.ptr()))
        plain = py::hasattr(value, "to_local") ? value.attr("to_local")() : py::none();
      if (THPVariable_CheckExact(plain.ptr()))
        out.emplace_back(name + "/" + py::str(slot).cast<std::string>(), plain.cast<at::Tensor>());
    }
  }
  return out;
}

void PythonOptimizer::restore_state(const OptimizerStateCopy& copy) {
  py::gil_scoped_acquire gil;
  optimizer_->attr("load_state_dict")(dynamic_cast<const PythonStateCopy&>(copy).state_dict());
}

}  // namespace nanscope::python
