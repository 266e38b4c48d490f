#pragma once
// nanscope-replay's work: re-run a snapshot's step at its own precision
// (N times), in fp32 with op-level capture and with anomaly detection, bisect,
// and decide. Everything from the snapshot alone (plus run.h5 beside it for
// the grad-norm trend, when it is there).
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/capture.hpp"
#include "verdict.hpp"

namespace nanscope::replay {

struct ReplayOptions {
  std::string snapshot;
  int repeats = 3;
  bool bisect = true;
};

struct ReplayReport {
  int64_t step = 0;
  std::string precision;
  format::Capture capture;          // from the snapshot (the trainer's re-run)
  int reproduced = 0, repeats = 0;  // of the re-runs at the original precision
  bool fp32_finite = false;
  format::Capture fp32_capture;
  std::string anomaly;                           // DetectAnomalyGuard's message in fp32, if it raised
  std::string rerun_error;                       // an op raised during a re-run (on the non-finite values), one line
  Fp32Search fp32_search = Fp32Search::not_run;  // not_run unless a precision verdict
  std::vector<std::string> fp32_modules;         // when found
  // The step drew random numbers (dropout, a VAE's randn_like): without one
  // sample every later draw shifts, so batch bisection cannot single one out
  // and is not run. Seen on the CPU generator.
  bool draws_random_numbers = false;
  bool batch_bisected = false;
  std::vector<int64_t> samples;       // batch rows without which the step is finite
  std::vector<int64_t> dataset_rows;  // their rows in the data set
  Verdict verdict;
};

ReplayReport replay_snapshot(const ReplayOptions& options);

}  // namespace nanscope::replay
