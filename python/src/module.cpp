// _nanscope: the C++ core's StepGuard and replay for Python (import nanscope;
// the Python half in python/nanscope/ gives them their keyword arguments).
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "guard_keywords.hpp"
#include "nanscope/common/blas_threads.hpp"
#include "nanscope/common/error_text.hpp"
#include "nanscope/common/log_line.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/core/step_guard_harness.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/poison_list.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/finiteness.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/snapshot.hpp"
#include "nanscope/replay/inspect.hpp"
#include "nanscope/replay/model_registry.hpp"
#include "nanscope/replay/replay.hpp"
#include "nanscope/replay/replay_report.hpp"
#include "python_averager.hpp"
#include "python_model.hpp"
#include "python_optimizer.hpp"

namespace nanscope::python {

namespace {

// What guard.step returns: the step's GuardedStep, and whether the run is over.
struct StepResult {
  GuardedStep step;
  bool stop = false;        // the run is dead (nothing could save it): stop training
  std::string stop_reason;  // why
};

// A Python function's exception as the guard must see it: Ctrl-C and
// sys.exit() pass through as the user's wish, not a fault to diagnose.
at::Tensor loss_value(const py::object& value, const char* what) {
  if (!THPVariable_Check(value.ptr()))
    throw py::type_error(std::string("nanscope: ") + what + " must return the loss as a tensor, got " +
                         py::repr(value).cast<std::string>());
  return value.cast<at::Tensor>();
}

// The version counters of a model call's tensors, positional then keyword
// (each tensor's `_version`), which move with every in-place write: how the
// watched form tells that a loop refilled its batch between the call and the
// backward. Read here in one pass, where a hook's Python would read each
// attribute on its own at every call. An inference tensor has no counter
// (-1): the guard keeps a copy of it (kept_batches.hpp).
py::tuple tensor_versions(const py::tuple& args, const py::dict& kwargs) {
  std::vector<int64_t> versions;
  const auto add = [&](const py::handle value) {
    if (!THPVariable_Check(value.ptr())) return;
    const at::Tensor& t = THPVariable_Unpack(value.ptr());
    versions.push_back(t.is_inference() ? -1 : int64_t(t._version()));
  };
  for (const py::handle value : args) add(value);
  for (const auto& [key, value] : kwargs) add(value);
  py::tuple out(versions.size());
  for (size_t i = 0; i < versions.size(); ++i) out[i] = py::int_(versions[i]);
  return out;
}

Amp amp_of(const std::string& amp) {
  const Amp parsed = format::from_string_or_unknown<Amp>(amp);
  if (parsed == Amp::unknown)
    throw py::value_error("nanscope: amp must be 'fp32', 'bf16' or 'fp16', not '" + amp + "'");
  return parsed;
}

// A field of the guard's state in state_dict(): the precision as its word, the rest as itself.
py::object state_value(Amp amp) { return py::str(format::to_string(amp)); }
template <typename T>
py::object state_value(const T& value) {
  return py::cast(value);
}
void read_state_value(py::handle value, Amp& amp) { amp = amp_of(value.cast<std::string>()); }
template <typename T>
void read_state_value(py::handle value, T& field) {
  field = value.cast<T>();
}

// StepGuard's row_dim=: a number for every tensor, or a dict of the tensors'
// names (as births name them: "hidden", "[2]") to their dimensions, the rest
// found from the batch's size.
RowDims row_dims_of(const py::handle& value) {
  RowDims rows;
  if (py::isinstance<py::dict>(value)) {
    for (const auto& [name, dim] : value.cast<py::dict>())
      rows.by_name[py::str(name).cast<std::string>()] = dim.cast<int64_t>();
  } else {
    rows.all = value.cast<int64_t>();
  }
  return rows;
}

class Guard {
 public:
  // `keywords`: the guard options given (guard_keywords.hpp); `options`: what
  // only Python has (model_name, log, row_dim; nanscope/__init__.py); `program`: the compiled program of a
  // torch.compile'd model (nanscope/_compiled.py), or None.
  Guard(py::object model, py::object optimizer, const py::dict& keywords, const py::dict& options, py::object average,
        int rank, int world_size, py::object program) {
    if (!average.is_none() && world_size > 1) averager_ = std::make_unique<PythonAverager>(average, rank, world_size);
    if (!py::isinstance(model, py::module_::import("torch.nn").attr("Module")))
      throw py::type_error("nanscope.StepGuard: model must be a torch.nn.Module (got " +
                           py::repr(model).cast<std::string>() + ")");
    if (!optimizer.is_none()) optimizer_ = std::make_unique<PythonOptimizer>(optimizer);
    GuardOptions o;
    set_guard_keywords(o, keywords);
    const std::string model_name = options["model_name"].cast<std::string>();
    o.model_name = model_name.empty() ? py::type::of(model).attr("__name__").cast<std::string>() : model_name;
    o.optimizer_name = optimizer.is_none() ? "none" : py::type::of(optimizer).attr("__name__").cast<std::string>();
    o.origin = format::Origin::python;
    // The replay command printed for a snapshot names this interpreter.
    o.config["python"] = py::module_::import("sys").attr("executable").cast<std::string>();
    o.log = options["log"].cast<bool>() ? &std::cerr : nullptr;
    o.rank = averager_ ? rank : 0;
    o.world_size = averager_ ? world_size : 1;
    row_dims_ = row_dims_of(options["row_dim"]);
    auto body = std::make_unique<PythonModel>(model, o.model_name, py::none(), program);
    guard_ = optimizer_ ? std::make_unique<StepGuard>(std::move(body), *optimizer_, o)
                        : std::make_unique<StepGuard>(std::move(body), o);
    if (averager_) harness().set_ranks(averager_.get());
  }

  StepResult closure_step(const py::function& closure, const py::object& batch, std::optional<int64_t> step,
                          std::optional<at::Tensor> rows) {
    if (!optimizer_)
      throw py::type_error(
          "nanscope.StepGuard: the closure form runs the optimizer's step; this guard has no "
          "optimizer (use the watched form: guard.backward(loss) ... guard.step())");
    const Batch b = batch_of(batch, row_dims_);
    // Made while the GIL is held: copying the function object needs it.
    LossClosure loss = [closure]() -> at::Tensor {
      py::gil_scoped_acquire gil;
      return loss_value(call_python(closure), "the closure");
    };
    return run([&](StepContext context) {
      if (step) context.step = *step;
      if (rows) context.batch_rows = *rows;
      return guard().closure_step(loss, b, context);
    });
  }

  // --- The watched form (GradScaler's calls).
  // fn(batch) -> loss: the loop's loss of any micro-batch, for re-runs.
  void set_loss_fn(py::object fn) {
    SharedObject shared = share(std::move(fn));
    guard().set_loss_fn([shared](const Batch& batch) -> at::Tensor {
      py::gil_scoped_acquire gil;
      return loss_value(call_python(*shared, batch_object(batch)), "loss_fn");
    });
  }
  // A model call of the watched form begins (its micro-batch's start; the
  // step's, at its first call). Returns the call's tensors' version counters,
  // or None where the run is stopped: no call of it begins.
  py::object begin_model_call(const py::tuple& args, const py::dict& kwargs) {
    if (guard().stopped()) return py::none();
    py::tuple versions = tensor_versions(args, kwargs);
    guard().begin_micro_batch();
    return std::move(versions);
  }
  at::Tensor scale(const at::Tensor& loss, const py::object& batch, const py::list& earlier_calls,
                   bool changed_since_call, std::optional<at::Tensor> rows) {
    // Each micro-batch's data set rows, in order: the step's rows (StepContext::batch_rows).
    if (rows) step_rows_.push_back(*rows);
    std::vector<Batch> earlier;
    for (const py::handle call : earlier_calls)
      earlier.push_back(batch_of(py::reinterpret_borrow<py::object>(call), row_dims_));
    // None: no micro-batch named and no model call seen; the step is checked and skipped, not re-run.
    return guard().scale(loss, batch.is_none() ? Batch() : batch_of(batch, row_dims_), earlier, changed_since_call);
  }
  at::Tensor unscale() {
    py::gil_scoped_release release;
    return guard().unscale();
  }
  StepResult step() {
    std::vector<at::Tensor> rows = std::move(step_rows_);
    step_rows_.clear();
    return run([&](StepContext context) {
      if (!rows.empty()) context.batch_rows = at::cat(rows);
      return guard().step(context);
    });
  }

  StepGuardHarness harness() { return StepGuardHarness(guard()); }
  StepGuard& guard() {
    if (!guard_) throw py::value_error("nanscope.StepGuard: the guard is closed");
    return *guard_;
  }
  // Closes run.h5 (its buffered rows written, the writer's mark cleared) and
  // lets go of the loop's model, loss function and optimizer.
  void close() {
    guard_.reset();
    optimizer_.reset();
    averager_.reset();
  }

 private:
  // One step without the GIL (it runs backward and may re-run Python code),
  // its exceptions as Python's.
  template <class Step>
  StepResult run(const Step& run_step) {
    // The step that stopped the run returned stop; any call after it raises.
    harness().refuse_if_stopped();
    StepResult result;
    py::gil_scoped_release release;
    try {
      StepContext context;
      context.averager = averager_.get();
      result.step = run_step(context);
    } catch (PythonInterrupt& interrupt) {
      throw std::move(interrupt.error);
    } catch (const ModelError& e) {
      // The closure's own exception, as Python raised it (a ZeroDivisionError stays one).
      if (e.original) std::rethrow_exception(e.original);
      throw;
    } catch (const DeadRunError& e) {
      result.stop = true;
      result.stop_reason = e.what();
      result.step.outcome.skipped = true;
      result.step.outcome.loss = result.step.outcome.grad_norm = std::numeric_limits<double>::quiet_NaN();
    }
    return result;
  }

  std::unique_ptr<PythonOptimizer> optimizer_;
  std::unique_ptr<PythonAverager> averager_;
  std::unique_ptr<StepGuard> guard_;
  RowDims row_dims_;
  std::vector<at::Tensor> step_rows_;  // the watched step's micro-batches' data set rows so far
};

// nanscope.replay: nanscope-replay's engine on a snapshot written from Python,
// with the user's factory and loss. Returns the report as JSON (the object the
// Python half builds) and as text; a bad snapshot raises ValueError, a replay
// that failed RuntimeError, each with nanscope-replay's one line.
// An other model the loss runs, as nanscope.replay hands it over: its label,
// parameters and (state_dict's) buffers.
using OtherTensors = std::tuple<std::string, probe::NamedTensorList, probe::NamedTensorList>;

std::pair<std::string, std::string> replay_report(const std::string& snapshot, py::object factory, py::object loss,
                                                  int repeats, bool bisect, bool write,
                                                  const std::vector<OtherTensors>& others) {
  SharedObject make = share(std::move(factory)), loss_fn = share(std::move(loss));
  replay::register_default_model([make, loss_fn, others](const ModelSpec& spec) -> std::unique_ptr<TrainableModel> {
    py::gil_scoped_acquire gil;
    py::object model = (*make)();
    // (model, optimizer): the optimizer as the loop built it, for the tensors it steps outside the model.
    py::object optimizer = py::none();
    if (py::isinstance<py::tuple>(model) && py::len(model) == 2) {
      optimizer = py::reinterpret_borrow<py::tuple>(model)[1];
      model = py::reinterpret_borrow<py::tuple>(model)[0];
      if (model.is_none()) model = py::module_::import("torch.nn").attr("Module")();  // a raw-tensor program
    }
    if (!py::isinstance(model, py::module_::import("torch.nn").attr("Module")))
      throw std::invalid_argument(
          "nanscope.replay: model() must build a torch.nn.Module, or (module, optimizer), not " +
          py::repr(model).cast<std::string>());
    auto built = std::make_unique<PythonModel>(model, spec.name, *loss_fn);
    for (const auto& [label, parameters, buffers] : others) built->add_other_model(label, parameters, buffers);
    if (!optimizer.is_none()) {
      std::vector<std::vector<at::Tensor>> groups;
      for (const py::handle group : optimizer.attr("param_groups")) {
        groups.emplace_back();
        for (const py::handle p : group["params"]) groups.back().push_back(p.cast<at::Tensor>());
      }
      built->add_optimizer_tensors(optimizer_tensors_outside(groups, built->named_parameters()));
    }
    return built;
  });
  replay::ReplayOptions options;
  options.snapshot = snapshot;
  options.repeats = repeats;
  options.bisect = bisect;
  std::pair<std::string, std::string> out;
  std::string bad_input, failed, not_appended;
  std::exception_ptr python_error;  // the factory or the loss raised: Python's own exception goes back as it was
  {
    py::gil_scoped_release release;
    try {
      const replay::ReplayReport report = replay::replay_snapshot(options);
      out = {replay::to_json(report), replay::to_text(report)};
      if (write) {
        try {
          replay::append_to_snapshot(snapshot, report);
        } catch (const format::FormatError& e) {
          not_appended = e.what();
        }
      }
    } catch (const format::FormatError& e) {
      bad_input = e.what();
    } catch (const std::invalid_argument& e) {
      bad_input = e.what();
    } catch (const py::error_already_set&) {
      python_error = std::current_exception();
    } catch (PythonInterrupt& interrupt) {  // Ctrl-C in the loss: the user's, not the replay's failure
      python_error = std::make_exception_ptr(std::move(interrupt.error));
    } catch (const std::exception& e) {
      failed = one_line_error(e);
    }
  }
  replay::register_default_model(nullptr);  // drops the Python objects while the GIL is held
  if (python_error) std::rethrow_exception(python_error);
  if (!bad_input.empty()) throw py::value_error("nanscope.replay: bad snapshot " + bad_input);
  if (!failed.empty()) throw std::runtime_error("nanscope.replay: the replay failed: " + failed);
  if (!not_appended.empty())
    PyErr_WarnEx(PyExc_RuntimeWarning,
                 ("nanscope.replay: result not appended to the snapshot: " + not_appended).c_str(), 1);
  return out;
}

// nanscope.StepResult: what one guarded step did.
void bind_step_result(py::module_& m) {
  py::class_<StepResult>(m, "StepResult", "What one guarded step did")
      .def_property_readonly(
          "counted", [](const StepResult& r) { return r.step.counted(); }, "the update reached the weights")
      .def_property_readonly("skipped", [](const StepResult& r) { return r.step.outcome.skipped; })
      .def_property_readonly(
          "stop", [](const StepResult& r) { return r.stop; },
          "the run is dead and nothing can save it: stop training (stop_reason says why)")
      .def_readonly("stop_reason", &StepResult::stop_reason)
      .def_property_readonly("loss", [](const StepResult& r) { return r.step.outcome.loss; })
      .def_property_readonly("grad_norm", [](const StepResult& r) { return r.step.outcome.grad_norm; })
      .def_property_readonly("amp", [](const StepResult& r) { return std::string(format::to_string(r.step.amp)); })
      .def_property_readonly("lr", [](const StepResult& r) { return r.step.lr; })
      .def_property_readonly("loss_scale", [](const StepResult& r) { return r.step.loss_scale; })
      .def_property_readonly("seconds", [](const StepResult& r) { return r.step.seconds; })
      .def_property_readonly(
          "first_birth", [](const StepResult& r) { return r.step.first_birth; },
          "where the first NaN/Inf was born, '' when the step was not investigated")
      .def_property_readonly("snapshot", [](const StepResult& r) { return r.step.snapshot; })
      .def_property_readonly("fell_back", [](const StepResult& r) { return r.step.fell_back; })
      .def_property_readonly("remedy", [](const StepResult& r) { return std::string(remedy_name(r.step.remedy)); })
      .def_property_readonly("restored", [](const StepResult& r) { return r.step.restored; })
      .def_property_readonly("error", [](const StepResult& r) { return r.step.error; })
      .def_property_readonly("warnings", [](const StepResult& r) { return r.step.warnings; })
      .def_property_readonly("rolled_back_to", [](const StepResult& r) { return r.step.rolled_back_to; })
      .def_property_readonly(
          "doomed_by", [](const StepResult& r) { return r.step.doomed_by; },
          "doom_search=True, at a failing step: the earlier update that doomed it ('step 40, batch row 3', "
          "'no earlier step', or why it was not searched); '' otherwise")
      .def_property_readonly(
          "doomed_by_step",
          [](const StepResult& r) -> py::object {
            return r.step.doomed_by_step >= 0 ? py::cast(r.step.doomed_by_step) : py::none();
          },
          "that step, or None")
      .def_property_readonly(
          "doom_rows", [](const StepResult& r) { return r.step.doom_rows; },
          "its batch rows without which the run survives ([]: its whole update)")
      .def_property_readonly(
          "listed_samples", [](const StepResult& r) { return r.step.listed_samples; },
          "the data set rows this step's `data` verdict added to the run's poison list "
          "(RUN_DIR/poisoned_samples.jsonl), which LeaveOut leaves out from the next epoch on")
      .def("__repr__", [](const StepResult& r) {
        return "<nanscope.StepResult counted=" + std::string(r.step.counted() ? "True" : "False") +
               " loss=" + std::to_string(r.step.outcome.loss) +
               (r.step.first_birth.empty() ? "" : " first_birth='" + r.step.first_birth + "'") +
               (r.stop ? " stop=True" : "") + ">";
      });
}

// The guard's object, behind nanscope.StepGuard (nanscope/_guard.py).
void bind_guard(py::module_& m) {
  py::class_<Guard>(m, "_StepGuard")
      .def(py::init<py::object, py::object, py::dict, py::dict, py::object, int, int, py::object>())
      .def("closure_step", &Guard::closure_step, py::arg("closure"), py::arg("batch"), py::arg("step") = py::none(),
           py::arg("rows") = py::none())
      .def("set_loss_fn", &Guard::set_loss_fn)
      .def("begin_model_call", &Guard::begin_model_call)
      .def("end_model_call", [](Guard& g) { g.harness().end_model_call(); })
      .def("refuse_if_stopped", [](Guard& g) { g.harness().refuse_if_stopped(); })
      .def("stop_for_failed_rank",
           [](Guard& g, int rank, const std::string& error) { g.harness().stop_for_failed_rank(rank, error); })
      .def("scale", &Guard::scale)
      .def("unscale", &Guard::unscale)
      .def("flags_for_gradient_reduction",
           [](Guard& g) -> py::object {
             const at::Tensor flags = g.harness().flags_for_gradient_reduction();
             return flags.defined() ? py::cast(flags) : py::none();
           })
      .def("step", &Guard::step)
      .def("undo_loops_update", [](Guard& g) { g.guard().undo_loops_update(); })
      .def_property_readonly("step_open", [](Guard& g) { return g.harness().step_open(); })
      .def_property_readonly("loss_scale", [](Guard& g) { return g.guard().loss_scale(); })
      .def_property_readonly("scaling", [](Guard& g) { return g.guard().scaling(); })
      .def_property_readonly("run_file", [](Guard& g) { return g.guard().run_file(); })
      .def_property_readonly("amp", [](Guard& g) { return std::string(format::to_string(g.guard().amp())); })
      .def_property_readonly("lr_multiplier", [](Guard& g) { return g.guard().lr_multiplier(); })
      .def_property_readonly("applied_steps", [](Guard& g) { return g.guard().applied_steps(); })
      .def_property_readonly("next_step", [](Guard& g) { return g.harness().next_step(); })
      .def_property_readonly("snapshots", [](Guard& g) { return g.guard().snapshots(); })
      .def_property_readonly("fp32_modules", [](Guard& g) { return g.guard().fp32_modules(); })
      // Modules that run otherwise inside the loop's own forward (the watched
      // form listens for their scopes): in fp32, or with a kernel pinned.
      .def_property_readonly("module_regions",
                             [](Guard& g) {
                               if (fp32_regions_apply(g.guard().amp(), g.guard().fp32_modules())) return true;
                               const std::vector<std::string> pins = g.guard().state().pinned_kernels;
                               return std::any_of(pins.begin(), pins.end(), [](const std::string& pin) {
                                 return pin.find('=') != std::string::npos;  // "attn=math": inside its module
                               });
                             })
      .def("state_dict",
           [](Guard& g) {
             const GuardState s = g.guard().state();
             py::dict d;
             for_each_guard_state_field(s, [&](const char* name, const auto& field) { d[name] = state_value(field); });
             d["next_step"] = g.harness().next_step();
             d["sentinel"] = s.sentinel;
             return d;
           })
      .def("load_state_dict",
           [](Guard& g, const py::dict& d) {
             GuardState s;
             // A state_dict from before format 1.7 has rollback_lr_multiplier, not lr_multiplier.
             s.lr_multiplier_lacks_fallback = !d.contains("lr_multiplier") && d.contains("rollback_lr_multiplier");
             for_each_guard_state_field(s, [&](const char* name, auto& field) {
               read_state_value(d[s.lr_multiplier_lacks_fallback ? name_before_1_7(name) : name], field);
             });
             if (d.contains("sentinel")) s.sentinel = d["sentinel"].cast<Sentinel::State>();
             g.guard().restore(s);
             g.harness().number_steps_from(d["next_step"].cast<int64_t>());
           })
      .def("flush", [](Guard& g) { g.guard().flush(); })
      .def("close", &Guard::close)
      .def_property_readonly("stopped", [](Guard& g) { return g.guard().stopped(); })
      .def("health", [](Guard& g) { return g.guard().health().nonfinite; });
}

// Run files and snapshots: a killed writer's mark, the other models a loss ran.
void bind_run_files(py::module_& m) {
  m.def("append_other_modules", [](const std::string& path, const probe::NamedTensorList& tensors) {
    probe::append_other_modules(path, tensors);
  });
  m.def("clear_mark_if_writer_gone", [](const std::string& path) {
    try {
      return format::clear_mark_if_writer_gone(path);
    } catch (const format::FormatError& e) {
      throw py::value_error(std::string("nanscope.open_run: ") + e.what());
    }
  });
  m.def("snapshot_other_modules", [](const std::string& path) {
    try {
      return probe::read_other_modules(path);
    } catch (const format::FormatError& e) {
      throw py::value_error(std::string("nanscope.replay: bad snapshot ") + e.what());
    }
  });
  m.def("guard_keyword_list", &guard_keyword_list);
}

// A run's poison list (RUN_DIR/poisoned_samples.jsonl).
void bind_poison_list(py::module_& m) {
  m.def(
      "poisoned_samples",
      [](const std::string& run_dir) {
        std::vector<format::PoisonedSample> list;
        try {
          list = format::read_poison_list(format::poison_list_path(run_dir));
        } catch (const format::FormatError& e) {
          throw py::value_error(std::string("nanscope: ") + e.what());
        }
        py::list out;
        for (const format::PoisonedSample& s : list) {
          py::dict d;
          d["row"] = s.row;
          d["step"] = s.step;
          d["rank"] = s.rank;
          d["birth"] = s.birth;
          d["why"] = s.why;
          out.append(d);
        }
        return out;
      },
      "the samples a run leaves out: its RUN_DIR/poisoned_samples.jsonl as dicts (row, step, rank, birth, why)");
  m.def("poison_list_path", &format::poison_list_path, "where a run directory keeps its poison list");
  m.def(
      "rows_left_out_at",
      [](const std::string& run_dir, int64_t step) {
        try {
          return format::rows_left_out_at(format::read_poison_list(format::poison_list_path(run_dir)), step);
        } catch (const format::FormatError& e) {
          throw py::value_error(std::string("nanscope: ") + e.what());
        }
      },
      "the rows an epoch that starts at `step` leaves out: those listed at step - 2 or before");
}

// The process's side: keyword checks, version counters, where lines go, module scopes.
void bind_process(py::module_& m) {
  m.def("tensor_versions", &tensor_versions, "the version counters of a call's tensors (positional, then keyword)");
  // DDP's communication hook: a bucket's largest magnitude, before it mixes
  // (one pass, no copy; LibTorch 1.13's vector_norm(inf) on the CPU took 60
  // times a sum's time).
  m.def("largest_magnitude", &probe::abs_max, "a tensor's largest magnitude (NaN when it holds a NaN)");
  m.def("keep_blas_single_threaded", &keep_blas_single_threaded,
        "OpenBLAS on one thread unless OPENBLAS_NUM_THREADS is set (python3 -m nanscope replay)");
  // nanscope.GuardConfig's check of its values, as the guard will read them.
  m.def("check_guard_keywords", [](const py::dict& keywords, const std::string& who) {
    GuardOptions options;
    set_guard_keywords(options, keywords, who);
  });
  // Every line of nanscope's in this process goes to `emit(text, step, rank,
  // model, warning)` (nanscope/_logging.py: the logging module) instead of
  // file descriptor 2. The function is kept for the process's life: a line
  // may come from a guard closed at the interpreter's exit.
  m.def("route_lines_to", [](py::object emit) {
    auto* kept = new py::object(std::move(emit));  // never freed: outlives every guard
    set_log_sink([kept](const LogLine& line) {
      if (!Py_IsInitialized()) return;
      py::gil_scoped_acquire gil;
      try {
        (*kept)(line.text, line.step, line.rank, line.model, line.warning);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("nanscope's log line");
      }
    });
  });
  m.def("scopes_active", [] { return probe::module_scopes_active(); });
  m.def("push_scope_path", [](const std::string& path) { return probe::open_module_scope_by_path(path); });
  m.def("pop_scope", [] { probe::close_module_scope(); });
}

// nanscope.replay and nanscope.inspect_snapshot.
void bind_replay(py::module_& m) {
  m.def("replay_report", &replay_report, py::arg("snapshot"), py::arg("model"), py::arg("loss"), py::arg("repeats"),
        py::arg("bisect"), py::arg("write"), py::arg("others"));
  // nanscope.inspect_snapshot: nanscope-replay --inspect's (json, text), a bad snapshot ValueError.
  m.def("inspect_snapshot", [](const std::string& snapshot) {
    try {
      const replay::SnapshotInspection inspection = replay::inspect_snapshot(snapshot);
      return std::make_pair(replay::to_json(inspection), replay::to_text(inspection));
    } catch (const format::FormatError& e) {
      throw py::value_error(std::string("nanscope.inspect_snapshot: bad snapshot ") + e.what());
    }
  });
}

}  // namespace

}  // namespace nanscope::python

PYBIND11_MODULE(_nanscope, m) {
  using namespace nanscope::python;
  m.doc() = "nanscope's C++ core: the step guard and replay (use the nanscope package, not this module)";
  py::register_exception<nanscope::DeadRunError>(m, "DeadRunError", PyExc_RuntimeError);
  bind_step_result(m);
  bind_guard(m);
  bind_run_files(m);
  bind_poison_list(m);
  bind_process(m);
  bind_doom_search(m);
  bind_replay(m);
}
