#include "python_model.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace nanscope::python {

py::handle module_attr(const char* module, const char* name) {
  static auto* found = new std::map<std::string, py::object>();  // leaked: see the header
  const std::string key = std::string(module) + ":" + name;
  auto it = found->find(key);
  if (it == found->end()) it = found->emplace(key, py::module_::import(module).attr(name)).first;
  return it->second;
}

SharedObject share(py::object object) {
  return SharedObject(new py::object(std::move(object)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

py::object batch_object(const at::Tensor& inputs, const at::Tensor& targets) {
  if (!targets.defined()) return py::cast(inputs);
  return py::make_tuple(inputs, targets);
}

py::object batch_object(const Batch& batch) {
  if (!batch.is_nested()) return batch_object(batch.inputs, batch.targets);
  py::list leaves;
  for (const at::Tensor& t : batch.leaves) leaves.append(py::cast(t));
  return module_attr("nanscope._batch", "unflatten")(batch.structure, leaves);
}

PythonModel::PythonModel(py::object module, std::string name, py::object loss, py::object program)
    : module_(share(module)),
      named_(share(py::module_::import("nanscope._scopes").attr("uncompiled")(module))),
      loss_(share(std::move(loss))),
      program_(share(program.is_none() ? py::module_::import("nanscope._compiled").attr("program_of")(module)
                                       : std::move(program))),
      name_(std::move(name)) {}

bool PythonModel::compiled() const { return !program_->is_none(); }

std::shared_ptr<void> PythonModel::compiled_alone(const std::string& path) {
  py::gil_scoped_acquire gil;
  if (program_->is_none()) return nullptr;
  auto* restore = new py::object(program_->attr("alone")(path));
  return std::shared_ptr<void>(restore, [](void* p) {
    py::gil_scoped_acquire gil;
    auto* undo = static_cast<py::object*>(p);
    try {
      (*undo)();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("nanscope: putting back a module compiled alone");
    }
    delete undo;
  });
}

at::Tensor PythonModel::loss(const at::Tensor& inputs, const at::Tensor& targets) {
  return loss(Batch(inputs, targets));
}

at::Tensor PythonModel::loss(const Batch& batch) {
  py::gil_scoped_acquire gil;
  if (loss_->is_none())
    throw std::logic_error("model '" + name_ +
                           "': its loss is the step's closure, which runs on the step's own batch only (pass "
                           "loss=fn(model, batch) to run another batch)");
  return call_python(*loss_, *module_, batch_object(batch)).cast<at::Tensor>();
}

namespace {

// Names, parameters and gradients as nanscope/_sharded.py gives them: a
// sharded model's (FSDP) are this rank's shards, named without the wrappers.
py::handle sharded(const char* name) { return module_attr("nanscope._sharded", name); }

NamedTensors named_tensors(const py::handle& items) {
  NamedTensors out;
  for (const py::handle item : items) {
    const py::tuple pair = item.cast<py::tuple>();
    out.emplace_back(pair[0].cast<std::string>(), pair[1].cast<at::Tensor>());
  }
  return out;
}

}  // namespace

NamedTensors PythonModel::all_named_parameters() const {
  py::gil_scoped_acquire gil;
  return named_tensors(sharded("named_parameters")(*named_));
}

NamedTensors PythonModel::trainable_parameters() const {
  py::gil_scoped_acquire gil;
  return named_tensors(sharded("named_parameters")(*named_, py::arg("trainable") = true));
}

NamedTensors PythonModel::gathered_parameters() {
  py::gil_scoped_acquire gil;
  return named_tensors(sharded("gathered_parameters")(*named_));
}

NamedTensors PythonModel::named_buffers() const {
  py::gil_scoped_acquire gil;
  // Listed at every step (the guard's transaction): read in place from the
  // modules' buffer dicts, which are found once (nanscope/_sharded.py).
  if (!buffer_tree_) buffer_tree_ = share(sharded("buffer_tree")(*named_));
  NamedTensors out;
  std::unordered_set<PyObject*> seen;  // a buffer two modules share is listed once, as named_buffers() does
  for (const py::handle entry : *buffer_tree_) {
    const py::tuple where = py::reinterpret_borrow<py::tuple>(entry);
    PyObject* buffers = where[0].ptr();
    if (PyDict_Size(buffers) == 0 || where[1]().is_none()) continue;  // no buffers, or the module is gone
    const std::string prefix = where[2].cast<std::string>();
    Py_ssize_t position = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(buffers, &position, &key, &value))
      if (value != Py_None && seen.insert(value).second)
        out.emplace_back(prefix + py::handle(key).cast<std::string>(), py::handle(value).cast<at::Tensor>());
  }
  return out;
}

std::vector<std::string> PythonModel::module_paths() const {
  py::gil_scoped_acquire gil;
  return sharded("module_names")(*named_).cast<std::vector<std::string>>();
}

void PythonModel::set_training(bool on) {
  py::gil_scoped_acquire gil;
  named_->attr("train")(on);
}

Batch batch_of(const py::object& batch, const RowDims& rows) {
  const int64_t row_dim = rows.all;
  Batch b;
  if (THPVariable_Check(batch.ptr())) {
    b = Batch(batch.cast<at::Tensor>());
  } else if (module_attr("nanscope._batch", "is_plain")(batch).cast<bool>()) {
    const py::sequence items = batch.cast<py::sequence>();
    b = Batch(items[0].cast<at::Tensor>(), items[1].cast<at::Tensor>());
  } else {
    const py::tuple flat = module_attr("nanscope._batch", "flatten")(batch);
    b = Batch::nested(flat[0].cast<std::vector<at::Tensor>>(), flat[1].cast<std::string>());
    if (b.leaves.empty())
      throw py::type_error(
          "nanscope: batch must hold tensors (a tensor, (inputs, targets), or a dict, tuple or list "
          "of tensors); got " +
          py::repr(batch).cast<std::string>());
  }
  b.row_dim = row_dim;
  if (!rows.by_name.empty()) {
    if (!b.is_nested())
      throw py::value_error("nanscope: row_dim names tensors (" + py::repr(py::cast(rows.by_name)).cast<std::string>() +
                            ") but the batch is one tensor or an (inputs, targets) pair: give row_dim as a number");
    const std::vector<std::string> names = b.leaf_names();
    b.leaf_row_dims.assign(names.size(), Batch::kFindRows);
    for (const auto& [name, dim] : rows.by_name) {
      const auto at = std::find(names.begin(), names.end(), name);
      if (at == names.end()) {
        std::string known;
        for (const std::string& n : names) known += (known.empty() ? "'" : ", '") + n + "'";
        throw py::value_error("nanscope: row_dim names '" + name + "', which the batch has not (its tensors: " + known +
                              ")");
      }
      b.leaf_row_dims[size_t(at - names.begin())] = dim;
    }
  }
  return b;
}

}  // namespace nanscope::python
