#include "nanscope/probe/probe.hpp"

#include "nanscope/common/log_line.hpp"

#include <exception>
#include <filesystem>
#include <iostream>
#include <limits>

#include "host_memory.hpp"
#include "nanscope/common/error_text.hpp"
#include "nanscope/probe/finiteness.hpp"
#include "nanscope/probe/nvtx.hpp"
#include "tensor_stats.hpp"

namespace nanscope::probe {

Probe::Probe(ProbeOptions options, const std::vector<std::string>& parameter_names)
    : options_(std::move(options)), layers_(parameter_names) {}

void Probe::begin_step(int64_t step, const at::Tensor& batch_rows) {
  step_ = step;
  batch_rows_ = batch_rows;
  // The whole cost of being able to re-run a step: the generator's ~2.5 KB
  // engine, copied into the memory the previous step's state had.
  cpu_rng_state_.take_now();
}

std::vector<float> Probe::layer_grad_norms(const std::vector<float>& parameter_norms) const {
  if (parameter_norms.size() != layers_.parameter_count()) return {};
  return layers_.fold_norms(parameter_norms.data());
}

at::Tensor Probe::batch_nonfinite(const Batch& batch) const {
  const std::vector<at::Tensor> tensors = batch.tensors();
  std::vector<at::Tensor> floating;
  // A tensor subclass's values (a DTensor's) are left to the step's own
  // verdict: its check would give a flag of its subclass, which the step's
  // host read cannot read.
  for (const at::Tensor& t : tensors)
    if (is_floating(t) && t.numel() > 0 && libtorch_own(t)) floating.push_back(t);  // read, never written
  if (floating.empty())
    return at::zeros({1},
                     tensors.empty() ? at::TensorOptions(at::kFloat) : tensors.front().options().dtype(at::kFloat));
  return any_nonfinite(floating);  // on the first tensor's device
}

namespace {

// Why a loss function or closure could not run the step again, in the words
// of what to change, where PyTorch's own message says it.
std::string rerun_failure_text(const std::string& error) {
  if (error.find("backward through the graph a second time") != std::string::npos)
    return "the loss function (or closure) cannot run the step again: it uses a tensor made by the step's own "
           "graph, e.g. state carried across steps (an RNN's hidden state) taken from the loop's variable after "
           "the forward; put the state the step began with, detached, in its batch (" +
           error + ")";
  return error;
}

}  // namespace

format::Capture Probe::investigate(const std::function<void()>& rerun, const at::Tensor& inputs) {
  return investigate([&](OpCapture&) { rerun(); }, std::vector<Batch>{Batch(inputs)});
}

format::Capture Probe::investigate(const std::function<void(OpCapture&)>& rerun,
                                   const std::vector<Batch>& micro_batches) {
  NANSCOPE_NVTX_RANGE("forensic_rerun");
  format::Capture capture;
  try {
    cpu_rng_state_.restore();
    {
      CaptureOptions capture_options = options_.capture;
      if (micro_batches.size() == 1) {
        capture_options.batch_size = micro_batches.front().rows();
        capture_options.row_dim = micro_batches.front().row_dim;
      }
      OpCapture op_capture(capture_options);
      // A NaN can make a later op raise (binary_cross_entropy checks its input
      // is in [0, 1]): the births before the exception are the answer.
      std::exception_ptr raised;
      try {
        rerun(op_capture);
      } catch (const std::exception&) {
        raised = std::current_exception();
      }
      capture = op_capture.result();
      // A non-finite input precedes every op the re-run saw, one that raised
      // on it (binary_cross_entropy on a NaN pixel) included, when what the
      // step failed on holds its values. A leaf the step never read (features
      // cached beside the batch), or read and discarded, is only a note.
      if (const std::optional<format::Birth> birth = input_birth(micro_batches)) {
        if (op_capture.failure_read_batch() == false && capture.first_birth) {
          capture.batch_not_read = true;
          capture.discarded.insert(capture.discarded.begin(), format::birth_text(*birth));
        } else {
          capture.first_birth = birth;
          (birth->kind == format::BirthKind::nan ? capture.first_nan_birth : capture.first_inf_birth) = birth;
          capture.reproduced = true;
          capture.discarded.clear();  // the batch's value is first; the ops' notes were about later ones
        }
      }
      if (raised && !capture.first_birth) std::rethrow_exception(raised);
    }
  } catch (const std::exception& e) {
    capture = format::Capture{};
    capture.ops_seen = -1;
    last_error_ = "forensic re-run failed: " + rerun_failure_text(one_line_error(e));
    write_log_line({"nanscope probe: " + last_error_, -1, options_.rank, "", true}, &std::cerr);
  }
  return capture;
}

// docs/design.md: a non-finite batch is a birth with phase "input", op "input",
// module "", and the sample's row within the batch.
std::optional<format::Birth> Probe::input_birth(const std::vector<Batch>& micro_batches) {
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const Batch& batch = micro_batches[k];
    const int64_t row = batch.first_nonfinite_row();
    at::Tensor values;
    std::string input;
    if (row >= 0) {
      values = batch.row_of(row);
      input = batch.nonfinite_tensor_name(row);
    } else {
      // A non-finite tensor without the batch's rows (a scalar, a tensor of
      // another length): the birth all the same, named, with no row.
      const std::vector<at::Tensor> tensors =
          batch.is_nested() ? batch.leaves : std::vector<at::Tensor>{batch.inputs, batch.targets};
      const std::vector<std::string> names = batch.leaf_names();
      for (size_t i = 0; i < tensors.size() && !values.defined(); ++i)
        if (tensors[i].defined() && is_floating(tensors[i]) && !at::isfinite(tensors[i]).all().item<bool>()) {
          values = tensors[i];
          if (i < names.size()) input = names[i];
        }
      if (!values.defined()) continue;
    }
    format::Birth birth;
    birth.op.op = "input";
    birth.op.phase = format::Phase::input;
    birth.op.index = -1;
    birth.op.output = tensor_stats(values);
    birth.kind = birth.op.output.nan_count > 0 ? format::BirthKind::nan : format::BirthKind::inf;
    birth.sample = row;
    birth.input = input;
    if (micro_batches.size() > 1) birth.micro_batch = int64_t(k);
    return birth;
  }
  return std::nullopt;
}

format::Capture Probe::input_capture(const std::vector<Batch>& micro_batches) {
  format::Capture capture;
  if (const std::optional<format::Birth> birth = input_birth(micro_batches)) {
    capture.first_birth = birth;
    (birth->kind == format::BirthKind::nan ? capture.first_nan_birth : capture.first_inf_birth) = birth;
    capture.reproduced = true;
    capture.ops_seen = 0;
  }
  return capture;
}

std::string Probe::save_snapshot(const SnapshotContents& contents) {
  const std::string path = snapshot_path(options_.run_dir, contents.step, options_.rank, options_.world_size);
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    write_snapshot(path, contents);
    return path;
  } catch (const std::exception& e) {
    last_error_ = e.what();
    if (!warned_) {
      write_log_line({"nanscope probe: cannot write snapshot " + path + ": " + e.what() +
                          " (training goes on; further snapshot errors are not repeated)",
                      contents.step, options_.rank, "", true},
                     &std::cerr);
      warned_ = true;
    }
    return "";
  }
}

}  // namespace nanscope::probe
