#pragma once
// Everything nanscope-train is told, as a plain struct: the CLI parses into it
// (options_cli.cpp) and run(options) takes it, so tests need no argv. The step
// guard's options (precision, clip, fallback, probe, warnings, rollback, run
// directory, ...) are its base: one list, handed to the guard as it is.
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/guard_options.hpp"
#include "nanscope/models/fault.hpp"
#include "nanscope/models/optimizer_kind.hpp"
#include "nanscope/trainer/dist_options.hpp"

namespace nanscope {

// --schedule: the LR after warmup stays (constant) or decays to 0 (cosine).
#define NANSCOPE_SCHEDULES(X) X(constant, "constant") X(cosine, "cosine")
NANSCOPE_DECLARE_WORDS_IN(format::Words, Schedule, NANSCOPE_SCHEDULES)
// --device: CUDA when there is one (auto), or the one named.
#define NANSCOPE_DEVICE_CHOICES(X) X(automatic, "auto") X(cpu, "cpu") X(cuda, "cuda")
NANSCOPE_DECLARE_WORDS_IN(format::Words, DeviceChoice, NANSCOPE_DEVICE_CHOICES)

}  // namespace nanscope

namespace nanscope::trainer {

struct TrainOptions : GuardOptions {
  // nanscope-train's documented defaults where they differ from the library's.
  TrainOptions() {
    clip = 1.0;
    fallback = FallbackMode::whole;  // the stock loop's one-shot fallback
    origin = format::Origin::nanscope_train;
  }
  std::string model = "gpt";  // mlp | gpt | PATH.pt
  std::string data;           // HDF5 with /inputs and /targets; empty: built-in data
  std::string init;           // checkpoint to start from
  int64_t steps = 100;
  int64_t batch_size = 16;
  double lr = 3e-4;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double weight_decay = 0.01;
  Schedule schedule = Schedule::constant;
  bool schedule_holds_on_skip = false;  // the schedule follows applied updates, not step numbers
  int64_t warmup = 0;
  double z_loss = 0;
  bool shuffle = true;
  std::string save;  // checkpoint written at the end (and every checkpoint_every steps)
  int64_t checkpoint_every = 0;
  int64_t keep_checkpoints = 0;  // periodic checkpoints also kept by step, the newest N (for --search-doom)
  std::string resume;            // RUN_DIR to continue from its newest checkpoint
  // After a run: RUN_DIR whose failing step's cause to search for among the
  // earlier steps (doom_offline.hpp), replaying from a checkpoint before it.
  std::string search_doom;
  int64_t failing_step = -1;   // the step to explain (-1: the run's first non-finite step)
  int64_t doom_budget = 5000;  // steps the offline search may replay in all
  bool doom_json = false;      // print the search's finding as one JSON object
  uint64_t seed = 0;
  int threads = 0;  // 0: LibTorch's default
  DeviceChoice device = DeviceChoice::automatic;
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

}  // namespace nanscope::trainer
