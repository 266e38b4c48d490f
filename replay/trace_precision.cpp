#include "trace_precision.hpp"

#include <string>
#include <utility>

#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/precision_trail.hpp"

namespace nanscope::replay {

namespace {

// The type the step's low-precision values were held in: autocast's, else the
// model's own 16-bit weights'.
at::ScalarType low_type(const ReplaySetup& setup) {
  if (setup.amp == Amp::fp16) return at::kHalf;
  if (setup.amp == Amp::bf16) return at::kBFloat16;
  return setup.model->own_16bit_type_name() == "float16" ? at::kHalf : at::kBFloat16;
}

}  // namespace

format::PrecisionTrail trace_precision(ReplaySetup& setup) {
  const probe::SnapshotContents& s = setup.snapshot;
  const std::string step_error = std::exchange(setup.rerun_error, {});
  // An fp16 step's backward ran on its scaled loss (rerun_is_finite's rule); fp32's on the loss itself.
  probe::PrecisionTrailRecorder recorder(low_type(setup), setup.amp == Amp::fp16 ? s.loss_scale : 1.0);
  probe::CaptureOptions options;
  options.trail_length = 0;
  options.batch_size = s.batch.rows() > 0 ? s.batch.rows() : -1;
  options.row_dim = s.batch.row_dim;
  int64_t birth_index = -1;
  {
    probe::OpCapture capture(options, recorder.low_precision_run());
    step_is_finite(setup, setup.amp, s.batch);
    const format::Capture found = capture.result();
    if (found.first_birth) birth_index = found.first_birth->op.index;
  }
  {
    probe::OpCapture capture(options, recorder.fp32_run());
    step_is_finite_in_fp32(setup, s.batch);
  }
  setup.rerun_error = step_error;
  return recorder.result(birth_index);
}

}  // namespace nanscope::replay
