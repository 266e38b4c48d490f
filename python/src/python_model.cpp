#include "python_model.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace nanscope::python {

py::handle module_attr(const char* module, const char* name) {
  // Keyed by the names' addresses (the callers' literals): no string is built per call.
  static auto* found = new std::map<std::pair<const char*, const char*>, py::object>();  // leaked: see the header
  const std::pair<const char*, const char*> key{module, name};
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

NamedTensors PythonModel::own_trainable_parameters() const {
  py::gil_scoped_acquire gil;
  return named_tensors(sharded("named_parameters")(*named_, py::arg("trainable") = true));
}

NamedTensors PythonModel::parameters_as_stepped() const {
  py::gil_scoped_acquire gil;
  return named_tensors((*named_).attr("named_parameters")());  // a DTensor as itself, not its local shard
}

NamedTensors PythonModel::own_gathered_parameters() {
  py::gil_scoped_acquire gil;
  return named_tensors(sharded("gathered_parameters")(*named_));
}

void PythonModel::read_buffer_dicts(std::vector<PyObject*>& entries) const {
  entries.clear();
  PyObject* tree = buffer_tree_->ptr();  // a list of (dict, module weakref, prefix)
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tree); ++i) {
    PyObject* where = PyList_GET_ITEM(tree, i);
    PyObject* buffers = PyTuple_GET_ITEM(where, 0);
    if (PyDict_Size(buffers) == 0) continue;
    PyObject* module = PyObject_CallNoArgs(PyTuple_GET_ITEM(where, 1));
    if (!module) throw py::error_already_set();
    const bool gone = module == Py_None;
    Py_DECREF(module);
    if (gone) continue;
    entries.push_back(where);
    Py_ssize_t position = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(buffers, &position, &key, &value)) {
      entries.push_back(key);
      entries.push_back(value);
    }
  }
}

NamedTensors PythonModel::named_buffers() const {
  py::gil_scoped_acquire gil;
  // Listed at every step (the guard's transaction): read in place from the
  // modules' buffer dicts, which are found once (nanscope/_sharded.py).
  if (!buffer_tree_) buffer_tree_ = share(sharded("buffer_tree")(*named_));
  std::vector<PyObject*>& entries = listed_.scratch;
  read_buffer_dicts(entries);
  const bool same = entries.size() == listed_.entries.size() &&
                    std::equal(entries.begin(), entries.end(), listed_.entries.begin(),
                               [](PyObject* now, const py::object& then) { return now == then.ptr(); });
  if (same) return listed_.named;
  NamedTensors out;
  std::unordered_set<PyObject*> seen;  // a buffer two modules share is listed once, as named_buffers() does
  for (size_t i = 0; i < entries.size();) {
    const py::tuple where = py::reinterpret_borrow<py::tuple>(entries[i++]);
    const std::string prefix = where[2].cast<std::string>();
    const Py_ssize_t count = PyDict_Size(where[0].ptr());
    for (Py_ssize_t k = 0; k < count; ++k, i += 2) {
      PyObject* key = entries[i];
      PyObject* value = entries[i + 1];
      if (value != Py_None && seen.insert(value).second)
        out.emplace_back(prefix + py::handle(key).cast<std::string>(), py::handle(value).cast<at::Tensor>());
    }
  }
  listed_.entries.assign(entries.size(), py::object());
  for (size_t i = 0; i < entries.size(); ++i) listed_.entries[i] = py::reinterpret_borrow<py::object>(entries[i]);
  listed_.named = out;
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

namespace {

// (inputs, targets): the core's own shape of a batch, no structure to keep.
bool is_pair_of_tensors(PyObject* batch) {
  return (PyTuple_Check(batch) || PyList_Check(batch)) && PySequence_Fast_GET_SIZE(batch) == 2 &&
         THPVariable_Check(PySequence_Fast_GET_ITEM(batch, 0)) && THPVariable_Check(PySequence_Fast_GET_ITEM(batch, 1));
}

}  // namespace

Batch batch_of(const py::object& batch, const RowDims& rows) {
  const int64_t row_dim = rows.all;
  Batch b;
  if (THPVariable_Check(batch.ptr())) {
    b = Batch(batch.cast<at::Tensor>());
  } else if (is_pair_of_tensors(batch.ptr())) {
    b = Batch(py::handle(PySequence_Fast_GET_ITEM(batch.ptr(), 0)).cast<at::Tensor>(),
              py::handle(PySequence_Fast_GET_ITEM(batch.ptr(), 1)).cast<at::Tensor>());
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
