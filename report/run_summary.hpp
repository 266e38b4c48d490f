#pragma once
// The numbers a person asks of a run first: how many steps, which counted,
// the losses, the precision over the run and the fp16 loss scale. Computed
// from a run file's rows and events; no HDF5 here.
#include <cstdint>
#include <optional>
#include <vector>

#include "nanscope/format/run_file.hpp"

namespace nanscope::report {

struct StepValue {
  int64_t step = 0;
  double value = 0;
};

// A stretch of steps that ran in one precision.
struct AmpSpan {
  format::Precision precision = format::Precision::unknown;
  int64_t first_step = 0, last_step = 0;
};

struct RunSummary {
  size_t rows = 0;
  std::optional<int64_t> first_step, last_step;
  // Rows whose update is part of the run's curve, rows skipped, and rows a
  // rollback took back (skipped rows are counted once, as skipped).
  size_t counted = 0, skipped = 0, rolled_back = 0;
  std::optional<StepValue> final_loss;                   // the last row's, finite or not
  std::optional<StepValue> last_finite_loss;             // the last finite loss of a step that was not skipped
  std::vector<AmpSpan> amp;                              // in step order
  std::optional<int64_t> fp32_from_step;                 // the first fp32 step after a lower precision: the fallback
  std::optional<double> loss_scale_min, loss_scale_max;  // over the fp16 steps
};

RunSummary summarize_run(const format::RunData& run);

// A /steps/amp entry as a precision (unknown: a newer nanscope's number).
format::Precision row_precision(uint8_t amp);

// A rollback event read back: the step it went back to and how many rows it
// took back. nullopt for a rollback event whose text names no target.
struct RollbackSpan {
  int64_t to_step = 0, at_step = 0;
  size_t rows_taken_back = 0;
};
std::optional<RollbackSpan> rollback_span(const format::RunData& run, const format::RunEvent& rollback);

}  // namespace nanscope::report
