// nanscope.find_dooming_step: the search for the step that doomed a run
// (core/doom_after_run.hpp), after a Python run: the guard's run file says
// which steps were applied and with what LR, precision and loss scale; the
// user's function gives each step's batch; the model and optimizer come in
// holding the state of a checkpoint saved before the failing step.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "nanscope/core/doom_after_run.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/format/error.hpp"
#include "python_model.hpp"
#include "python_optimizer.hpp"

namespace nanscope::python {

namespace {

std::string search_doom(const std::string& run_file, py::object module, py::object optimizer, py::object loss,
                        py::object batches, int64_t start_step, int64_t failing_step, double clip, double spike_ratio,
                        int64_t budget, py::object progress, int64_t row_dim) {
  format::RunData run;
  try {
    run = format::read_run(run_file);
  } catch (const format::FormatError& e) {
    throw py::value_error(std::string("nanscope.find_dooming_step: bad run file ") + e.what());
  }
  const int64_t failing = failing_step_of(run, failing_step);
  if (start_step > failing)
    throw py::value_error("nanscope.find_dooming_step: the checkpoint's step " + std::to_string(start_step) +
                          " is after the failing step " + std::to_string(failing) +
                          ": the search needs a state saved before it");
  // clip < 0: the guard's clip, as the run recorded it (a loop that clipped by
  // itself, in the watched form, says its own).
  if (clip < 0) {
    GuardOptions recorded;
    if (const auto it = run.config.find("clip"); it != run.config.end()) {
      try {
        find_guard_option("clip")->set(recorded, it->second);  // read as the option reads its text
      } catch (const std::invalid_argument& e) {
        throw py::value_error("nanscope.find_dooming_step: run.h5 records clip '" + it->second + "': " + e.what());
      }
    }
    clip = recorded.clip;
  }
  PythonModel model(module, "model", loss);
  PythonOptimizer steps_optimizer(optimizer);
  RollbackOptions rollback;
  rollback.spike_ratio = spike_ratio;
  AfterRunSteps steps(run, start_step, failing);
  steps.rebuild = [&](StepRecord& record) {
    py::gil_scoped_acquire gil;
    MicroBatch micro;
    micro.batch = batch_of(call_python(batches, record.step), RowDims{row_dim, {}});
    record.micro_batches = {std::move(micro)};
  };
  steps.budget = budget;
  if (!progress.is_none())
    steps.progress = [&](const std::string& line) {
      py::gil_scoped_acquire gil;
      call_python(progress, line);
    };
  AfterRunSearch found;
  try {
    py::gil_scoped_release release;  // autograd runs without it; the callbacks take it back
    found = search_after_run(model, steps_optimizer, clip, rollback, steps);
  } catch (PythonInterrupt& interrupt) {
    throw std::move(interrupt.error);  // Ctrl-C ends the search, it is not a step that failed
  }
  if (!found.reproduced)
    throw std::runtime_error("nanscope.find_dooming_step: replayed from the checkpoint, step " +
                             std::to_string(failing) +
                             " does not fail again (or a step the run applied before it fails): the checkpoint, "
                             "the batches or the RNG state are not the run's" +
                             (found.error.empty() ? std::string() : "; a step raised: " + found.error));
  const DoomFinding& f = found.finding;
  return doom_json(f, failing, found.steps_run, doom_sentence(f, failing, found.rows_text));
}

}  // namespace

void bind_doom_search(py::module_& m) {
  m.def("_search_doom", &search_doom, py::arg("run_file"), py::arg("module"), py::arg("optimizer"), py::arg("loss"),
        py::arg("batches"), py::arg("start_step"), py::arg("failing_step"), py::arg("clip"), py::arg("spike_ratio"),
        py::arg("budget"), py::arg("progress"), py::arg("row_dim"));
}

}  // namespace nanscope::python
