#pragma once
// The probe, as a training loop uses it (the trainer is one such loop):
//
//   nanscope::probe::Probe probe({run_dir}, parameter_names);
//   for (step ...) {
//     probe.begin_step(step, rows);                       // RNG state: a cheap copy
//     ... forward, backward, unscale; copy [loss, norm, found_inf,
//         per-parameter norms] to the host once ...
//     auto layer_norms = probe.layer_grad_norms(parameter_norms);
//     if (!finite) {
//       bool bad_batch = probe.batch_nonfinite(batch).item<float>() != 0;  // asked of a failed step only
//       auto capture = probe.investigate(rerun_step, x);  // re-run with op capture
//       probe.save_snapshot(contents_with(capture));      // never throws
//     }
//   }
//
// A clean step costs the RNG copy, one device reduction over the batch and
// host arithmetic on the norms it already has; nothing per op.
#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/capture.hpp"
#include "nanscope/probe/batch.hpp"
#include "nanscope/probe/layer_index.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/snapshot.hpp"

namespace nanscope::probe {

struct ProbeOptions {
  std::string run_dir;           // snapshots go to RUN_DIR/snapshots/
  int rank = 0, world_size = 1;  // a multi-process run: snapshots go to RUN_DIR/snapshots/rank-R/
  CaptureOptions capture{};
};

class Probe {
 public:
  Probe(ProbeOptions options, const std::vector<std::string>& parameter_names);

  const LayerIndex& layers() const { return layers_; }

  // Step start: remembers the batch rows (undefined: not known yet) and the
  // CPU generator's state so the step can be re-run exactly.
  void begin_step(int64_t step, const at::Tensor& batch_rows);
  // The data set rows, when the loop says them only at the step's end (a watched step).
  void set_batch_rows(const at::Tensor& batch_rows) { batch_rows_ = batch_rows; }
  // A one-element float tensor on the batch's device: 1 when a floating
  // tensor of the batch (a nested one too) holds a NaN/Inf. Integer inputs
  // (tokens) are always finite: a zero, no kernel.
  at::Tensor batch_nonfinite(const Batch& batch) const;
  std::vector<float> layer_grad_norms(const std::vector<float>& parameter_norms) const;

  // Restores the step's RNG state, runs `rerun` (forward + backward of the
  // step, at the same precision and loss scale) under op-level capture, and
  // returns what it found. A non-finite batch is reported as an input birth
  // naming the sample row. Errors inside `rerun` are caught and reported in
  // the returned capture's ops_seen = -1 (the probe never throws into a loop).
  format::Capture investigate(const std::function<void()>& rerun, const at::Tensor& inputs);
  // The same for a step of micro-batches: `rerun` runs them in order and
  // calls OpCapture::begin_micro_batch before each; an input birth names the
  // first micro-batch (and its row) holding a non-finite value.
  format::Capture investigate(const std::function<void(OpCapture&)>& rerun, const std::vector<Batch>& micro_batches);

  // Writes RUN_DIR/snapshots/[rank-R/]step-NNNNNNN.h5. Never throws: on failure (disk
  // full, no permission) it warns once on stderr and returns "".
  std::string save_snapshot(const SnapshotContents& contents);
  // The first non-finite sample of the micro-batches, as the birth every op
  // comes after (phase input), or nullopt when they are finite.
  static std::optional<format::Birth> input_birth(const std::vector<Batch>& micro_batches);
  // A capture of that birth alone, with no re-run: a step whose input is
  // already non-finite needs none (0 ops seen; empty when the inputs are finite).
  static format::Capture input_capture(const std::vector<Batch>& micro_batches);
  const std::string& last_error() const { return last_error_; }

  int64_t step() const { return step_; }
  const at::Tensor& batch_rows() const { return batch_rows_; }
  const CpuRngState& cpu_rng_state() const { return cpu_rng_state_; }

 private:
  ProbeOptions options_;
  LayerIndex layers_;
  int64_t step_ = -1;
  at::Tensor batch_rows_;
  CpuRngState cpu_rng_state_;
  bool warned_ = false;
  std::string last_error_;
};

}  // namespace nanscope::probe
