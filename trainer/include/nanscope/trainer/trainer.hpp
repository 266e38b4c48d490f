#pragma once
// run(options): the whole fine-tune, from set-up to the summary.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

struct TrainSummary {
  int64_t steps_run = 0;
  int64_t skipped = 0;
  int64_t rollbacks = 0;
  int64_t fallback_step = -1;     // -1: the fallback never fired
  double last_finite_loss = 0;    // the loss of the last step that was not skipped
  int64_t last_finite_step = -1;  // -1: every step was skipped
  double final_lr = 0;
  double final_loss_scale = 1;
  double steps_per_second = 0;
  double median_step_time = 0;  // seconds
  bool interrupted = false;
  std::string run_file;
  std::vector<std::string> snapshots;  // written by the probe, in step order
  // The checkpoint (--save) that holds the model now: steps done when it was
  // written (-1: none), and how many were refused because the state was sick.
  int64_t saved_step = -1;
  std::string saved_path;
  int64_t saves_refused = 0;
  // Multi-process runs.
  int world_size = 1;
  double median_allreduce_time = 0;        // seconds in the gradient all-reduce, median over steps
  int64_t median_collectives = 0;          // collectives a step issued, median over steps
  int64_t gradient_buckets = 0;            // what a plain data-parallel step reduces: one collective each
  std::vector<int> first_nonfinite_ranks;  // the ranks whose own check failed at the first skip
};

// Throws std::invalid_argument / format::FormatError for bad options or input
// (the CLI exits 2 for those); anything else is a training failure.
TrainSummary run(const TrainOptions& options, std::ostream& log);

void print_summary(const TrainSummary& summary, std::ostream& out);

}  // namespace nanscope::trainer
