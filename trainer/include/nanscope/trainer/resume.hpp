#pragma once
// --resume: the checkpoint a run goes on from. One process takes the newest
// healthy one of its checkpoint and the one kept before it; several ranks take
// the newest step every rank still holds.
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "nanscope/core/checkpoint.hpp"
#include "nanscope/trainer/distributed.hpp"
#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

// --resume: the checkpoint the run directory's run wrote last, with what it
// needs to go on. Throws std::invalid_argument naming what is missing.
struct Resumption {
  std::string checkpoint;
  int64_t steps_done = 0;
  ResumeState state;
  std::string passed_over;  // newer checkpoints that were not healthy, and why
  // One process: chosen by health. Several ranks choose the newest step all
  // of them hold (agreed_checkpoint), which nanscope only writes healthy.
  bool health_checked = false;
};

// Loads the chosen checkpoint's weights into `model` and reads what else it
// holds; nullopt without --resume. `group`: several ranks (nullptr: one
// process). Throws std::invalid_argument naming what is missing.
std::optional<Resumption> resumption(const TrainOptions& options, TrainableModel& model, ProcessGroup* group,
                                     at::Device device);

// What a checkpoint holds besides the weights, put back: the optimizer's
// state (by parameter name) and the CPU generator's. The guard's own state is
// the caller's to restore, into a guard it has made.
void restore_optimizer_and_rng(const ResumeState& state, TrainableModel& model, torch::optim::Optimizer& optimizer);

// --save with several ranks: rank 0 writes it (the weights are the same on
// every rank), unless the path names "{rank}", which each rank fills in. ""
// for a rank that writes none.
std::string checkpoint_path_for_rank(const std::string& path, const DistOptions& d);

}  // namespace nanscope::trainer
