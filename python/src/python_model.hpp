#pragma once
// A Python torch.nn.Module as the core sees a model: its parameters, buffers
// and modules come from the module's own named_parameters(), named_buffers()
// and named_modules() (the dotted paths PyTorch gives: ModuleList, ModuleDict,
// nested Sequential; a tied parameter once). Its forward and loss are the
// step's closure (the guard's ClosureModel); on any other batch, replay's
// loss function `loss(model, batch)`.
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/core/model.hpp"

namespace nanscope::python {

namespace py = pybind11;

// A Python object the core may copy or drop without the GIL: the last owner
// takes the GIL to release it.
using SharedObject = std::shared_ptr<py::object>;
SharedObject share(py::object object);

// An attribute of a Python module (a function of nanscope's Python half),
// looked up once per process: py::module_::import goes through __import__
// and costs microseconds, which a lookup on every step paid. The caller holds
// the GIL. Never released: a handle dropped after the interpreter ended would crash.
py::handle module_attr(const char* module, const char* name);

// Ctrl-C or sys.exit() inside the user's code: not an error of the model for
// the guard or a replay to diagnose (it is no std::exception, so they let it
// pass), but the user's wish, handed back to Python as it was raised.
struct PythonInterrupt {
  py::error_already_set error;
};

// fn(args...) with the GIL held; Ctrl-C and sys.exit() come out as PythonInterrupt.
template <class... Args>
py::object call_python(const py::object& fn, Args&&... args) {
  try {
    return fn(std::forward<Args>(args)...);
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) throw PythonInterrupt{std::move(e)};
    throw;
  }
}

// A batch as Python code sees it: (inputs, targets), or inputs alone; a
// nested batch rebuilt in the structure the loop gave it (nanscope/_batch.py).
py::object batch_object(const at::Tensor& inputs, const at::Tensor& targets);
py::object batch_object(const Batch& batch);
// How the loop says where a batch's samples lie: one dimension for every
// tensor (row_dim=1 for (seq, batch) data), and the tensors that lie
// otherwise by their names in the batch ({"[2]": 1}, {"hidden": 1}).
struct RowDims {
  int64_t all = 0;
  std::map<std::string, int64_t> by_name;
};
// Any batch from Python: a tensor, (inputs, targets), or a dict, tuple or list
// of them (nested; non-tensor leaves kept as they are), its samples as
// `rows` says. Throws TypeError for a batch without tensors, ValueError for
// a row dimension named for a tensor the batch has not.
Batch batch_of(const py::object& batch, const RowDims& rows);

// nanscope._search_doom (doom_search.cpp).
void bind_doom_search(py::module_& m);

class PythonModel : public TrainableModel {
 public:
  // `loss`: None, or fn(model, batch) -> loss, which is given `module` as it
  // is; the names are those of the module inside a torch.compile'd one.
  // `program`: a compiled model's nanscope._compiled.Program (None: the
  // program_of `module`). `name` goes into snapshots.
  PythonModel(py::object module, std::string name, py::object loss, py::object program = py::none());

  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override;
  at::Tensor loss(const Batch& batch) override;
  NamedTensors all_named_parameters() const override;
  NamedTensors own_gathered_parameters() override;
  NamedTensors own_trainable_parameters() const override;
  NamedTensors parameters_as_stepped() const override;
  NamedTensors named_buffers() const override;
  std::vector<std::string> module_paths() const override;
  bool scopes_named_by_hooks() const override { return true; }  // nanscope/_scopes.py
  void set_training(bool on) override;
  ModelSpec spec() const override { return {name_, {}, ""}; }
  bool compiled() const override;
  std::shared_ptr<void> compiled_alone(const std::string& path) override;

 private:
  SharedObject module_, named_, loss_, program_;
  mutable SharedObject buffer_tree_;  // nanscope._sharded.buffer_tree, read at the first named_buffers()
  // The buffer dicts' entries, in order and borrowed: each live module's
  // (dict, weakref, prefix) tuple, then each key and value its dict holds.
  void read_buffer_dicts(std::vector<PyObject*>& entries) const;
  // What named_buffers() listed last, and the entries it read them from, held
  // (an address is never a new object's): while the dicts hold the same
  // entries, a step lists the same buffers again without building a name.
  struct ListedBuffers {
    std::vector<py::object> entries;
    NamedTensors named;
    std::vector<PyObject*> scratch;  // this call's entries, in memory kept from step to step
  };
  mutable ListedBuffers listed_;
  std::string name_;
};

}  // namespace nanscope::python
