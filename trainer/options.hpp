#pragma once
// Everything nanscope-train is told, as a plain struct: the CLI parses into it
// (options_cli.cpp) and run(options) takes it, so tests need no argv.
#include <cstdint>
#include <string>
#include <vector>

#include "dist_options.hpp"
#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/fault.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/rollback.hpp"

namespace nanscope {

struct TrainOptions {
  std::string model = "gpt";  // mlp | gpt | PATH.pt
  std::string data;           // HDF5 with /inputs and /targets; empty: built-in data
  std::string init;           // checkpoint to start from
  int64_t steps = 100;
  int64_t batch_size = 16;
  double lr = 3e-4;
  std::string optimizer = "adamw";  // adamw | sgd
  double weight_decay = 0.01;
  std::string schedule = "constant";    // constant | cosine
  bool schedule_holds_on_skip = false;  // the schedule follows applied updates, not step numbers
  int64_t warmup = 0;
  double clip = 1.0;  // <= 0: no clipping
  Amp amp = Amp::fp32;
  double lr_backoff = 0.5;
  FallbackMode fallback = FallbackMode::whole;
  std::vector<std::string> fp32_modules;  // run with autocast off from the first step
  double fallback_min_scale = 1.0;        // fp16: fall back once the scale drops below this
  double z_loss = 0;
  bool shuffle = true;
  bool probe = true;
  bool warn = true;                 // early warnings (core/sentinel.hpp)
  RollbackOptions rollback;         // --rollback and its sizes (core/rollback.hpp)
  bool capture_every_step = false;  // op-level capture on every step, not only the re-run
  int64_t act_absmax_every = 0;     // per-layer activation abs-max every N steps (0: never)
  std::string run_dir = "nanscope-run";
  int64_t max_nonfinite_run = 20;  // non-finite steps in a row with nothing left to try: the run is dead
  int64_t max_snapshots = 3;       // snapshots per run: one per distinct first birth, at most this many
  std::string save;                // checkpoint written at the end (and every checkpoint_every steps)
  int64_t checkpoint_every = 0;
  std::string resume;  // RUN_DIR to continue from its newest checkpoint
  uint64_t seed = 0;
  int threads = 0;              // 0: LibTorch's default
  std::string device = "auto";  // auto | cpu | cuda
  bool tf32 = false;
  bool deterministic = false;
  std::vector<Fault> faults;
  // Built-in model sizes.
  int64_t n_layer = 2, n_head = 4, n_embd = 64, seq_len = 64;
  int64_t hidden = 128;
  int64_t log_every = 0;  // 0: about once a second
  bool quiet = false;
  // Data parallel across processes (torchrun's environment or flags).
  // --batch-size is per rank; the global batch is batch_size x world_size.
  DistOptions dist;
};

}  // namespace nanscope
