#pragma once
// nanscope-train --search-doom RUN_DIR: the search for the step whose update
// doomed a run (core/doom_search.hpp, docs/recovery.md), after the run ended
// or was killed. It replays from the newest checkpoint saved before the
// failing step (then the one kept before it, if the newer already fails with
// every update left out), rebuilding each step in between from what the run
// recorded: its batch from the step number (the data order), its LR,
// precision, loss scale and whether it was applied from run.h5, its planted
// fault from the options. Nothing in RUN_DIR is written.
#include <cstdint>
#include <ostream>
#include <string>

#include "nanscope/core/doom_search.hpp"
#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

struct OfflineDoomSearch {
  int64_t failing_step = -1;
  std::string checkpoint;  // the one replayed from
  int64_t from_step = -1;  // the checkpoint holds the state after this step
  DoomFinding finding;
  std::string rows_text;  // the dooming step's rows, with their data set rows ("its update": none)
  int64_t steps_run = 0;  // over every replay, the reproduction included
  double seconds = 0;
  std::string text;  // the finding as the log says it
};

// Throws std::invalid_argument when RUN_DIR has no failing step, no checkpoint
// before it, or options the search cannot replay (several ranks);
// std::runtime_error when the failing step does not fail again when replayed.
OfflineDoomSearch search_doom_offline(const TrainOptions& options, std::ostream& log);

}  // namespace nanscope::trainer
