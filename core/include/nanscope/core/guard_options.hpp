#pragma once
// What a StepGuard is told (step_guard.hpp), as a plain struct without
// LibTorch: nanscope-train's TrainOptions is a GuardOptions plus what only the
// harness needs, and its command line parses into both beside the LibTorch
// batches. A new guard option is a field here and an entry in guard_option_list.cpp,
// which makes its flag, its Python keyword and its run.h5 config entry.
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/rollback.hpp"
#include "nanscope/core/sentinel.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// The search for the earlier step whose update doomed a failing one
// (doom_search.hpp, docs/recovery.md): off unless asked for. On, each step
// keeps a reference to its batch (no copy) and its RNG state back to the
// oldest rollback state, up to `memory_mb`; a clean step costs nothing more.
struct DoomSearchOptions {
  bool enabled = false;
  double memory_mb = 512;  // the batches kept for it; beyond this the oldest go (and the search reaches less far)
};

// Every member has an initializer, so `{run_dir, Amp::bf16}` sets the first two
// and the rest keep their defaults without -Wmissing-field-initializers. The
// defaults add nothing the loop did not do (no clipping unless asked), act on
// what a failed step's diagnosis found (a data fault is skipped, not punished
// with fp32 and a halved LR for the rest of the run) and speak on stderr;
// nanscope-train sets its own documented defaults (the stock loop's).
struct GuardOptions {
  std::string run_dir = "nanscope-run";             // run.h5 and snapshots/ go here (created)
  Amp amp = Amp::fp32;                              // the precision to start in
  double clip = 0;                                  // global grad-norm clip after unscaling; 0: off
  FallbackMode fallback = FallbackMode::automatic;  // what a non-finite step triggers (fallback.hpp)
  double lr_backoff = 0.5;                          // the LR multiplier the whole-model fallback applies
  // Modules (dotted paths, as named_modules() names them) that run with
  // autocast off from the first step: a planned remedy (--fp32-modules).
  std::vector<std::string> fp32_modules{};
  double fallback_min_scale = 1.0;  // fp16: the scaler's business until the scale drops below this
  bool probe = true;                // per-layer grad norms and the forensic re-run
  bool capture_every_step = false;  // op-level capture on every step (slow; for hunting)
  int64_t act_absmax_every = 0;     // per-layer activation abs-max every N steps (0: never)
  int64_t max_snapshots = 3;        // one per distinct first birth, at most this many
  // This many non-finite steps in a row, with nothing left to try (the fp32
  // fallback done or off, no rollback left or rollback off), and the run is
  // dead: it stops (DeadRunError). Weights that are finite but wrecked make
  // every later step non-finite, and skipping would go on for ever. 0: never.
  int64_t max_nonfinite_run = 20;
  bool warn = true;  // early warnings (sentinel.hpp) as events and log lines
  SentinelOptions sentinel{};
  RollbackOptions rollback{};       // rollback.enabled: go back to a saved good state when skipping cannot save the run
  DoomSearchOptions doom_search{};  // a failing step: find the earlier update that doomed it (keeps rollback states)
  std::string optimizer_name{};     // recorded in snapshots ("adamw", "sgd", yours)
  // The name snapshots give a model trained through a closure step
  // (StepGuard(module, ...)): replay finds its factory by it.
  std::string model_name = "model";
  // Who runs the loop, recorded in run.h5 and snapshots: advice is worded for
  // it (nanscope-train's flags, these options in C++, Python's keywords).
  format::Origin origin = format::Origin::cpp;
  std::map<std::string, std::string> config{};  // written into run.h5 and every snapshot
  int rank = 0, world_size = 1;                 // data parallel: this rank's run file and snapshots
  std::ostream* log = &std::cerr;               // one line per skip, birth and fallback; nullptr: none
  std::string log_prefix{};                     // e.g. "[rank 1] "
  // Resuming: go on writing the run file, dropping its rows after this step
  // (>= 0), and say where from in a resume event.
  int64_t resume_after_step = -1;
  std::string resume_from{};
};

}  // namespace nanscope
