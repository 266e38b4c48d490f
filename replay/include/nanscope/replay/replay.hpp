#pragma once
// nanscope-replay's work: re-run a snapshot's step at its own precision
// (N times), in fp32 with op-level capture and with anomaly detection, bisect,
// and decide. Everything from the snapshot alone (plus run.h5 beside it for
// the grad-norm trend, when it is there).
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/capture.hpp"
#include "nanscope/format/precision_trail.hpp"
#include "nanscope/replay/verdict.hpp"

namespace nanscope::replay {

struct ReplayOptions {
  std::string snapshot;
  int repeats = 3;
  bool bisect = true;
};

struct ReplayReport {
  int64_t step = 0;
  // From the snapshot (the trainer's re-run); a compiled model's eager
  // re-run here, when it names a birth the snapshot has not.
  format::Capture capture;
  // What the re-runs and bisections established, exactly what decide() reads:
  // reproduced of repeats, fp32_finite, the fp32 search and modules, the
  // samples, the batch's data set rows, the birth and its trail, the
  // precision, who ran the loop, the grad-norm trend.
  VerdictInputs evidence;
  format::Capture fp32_capture;
  std::string anomaly;      // DetectAnomalyGuard's message in fp32, if it raised
  std::string rerun_error;  // an op raised during a re-run (on the non-finite values), one line
  // The step drew random numbers (dropout, a VAE's randn_like): without one
  // sample every later draw shifts, so batch bisection cannot single one out
  // and is not run. Seen on the CPU generator.
  bool draws_random_numbers = false;
  bool batch_bisected = false;
  // Bisected, no single row found: why, in one line ("" when rows were found).
  std::string no_row_found;
  // The training run's search for the earlier step that doomed this one
  // (run.h5's `doom` event beside the snapshot), or "".
  std::string doomed_by;
  Verdict verdict;
  // A precision verdict's step compared op by op with fp32 up to its birth:
  // where precision was lost (not for a compiled model, whose ops the
  // capture cannot see one by one).
  std::optional<format::PrecisionTrail> precision_trail;
};

ReplayReport replay_snapshot(const ReplayOptions& options);

}  // namespace nanscope::replay
