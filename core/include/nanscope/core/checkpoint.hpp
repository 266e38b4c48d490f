#pragma once
// Checkpoints are nanscope HDF5 files (kind nanscope-checkpoint): the model's
// spec and its parameters and buffers by name, readable with h5py, and the
// state's health when it was written. A sick state (a NaN anywhere in the
// weights, buffers or optimizer state) is never written: the file already at
// PATH, the last healthy one, stays.
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include <optional>

#include "nanscope/core/guard_state.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/state_health.hpp"

namespace nanscope {

// What --resume needs besides the weights: the optimizer's state, the CPU
// random generator, and the step guard's precision, scaler and backoffs.
struct ResumeState {
  NamedTensors optimizer_state;  // optimizer_state_by_name(): the optimizer's own tensors, streamed out
  at::Tensor cpu_rng;
  GuardState guard;
};

// The health a checkpoint records: it was finite when written (always, for
// files this version writes), after how many steps, at which loss.
struct CheckpointHealth {
  bool finite = true;
  int64_t step = 0;
  double loss = 0;  // the last finite loss before it (NaN: none yet)
};

// Writes PATH.part and renames it over PATH, so a crash never leaves half a
// checkpoint; with `resume`, the checkpoint can also continue the run
// (/training). Refuses a sick state: writes nothing and returns its health
// (finite() false, naming the tensors), PATH as it was. `optimizer` (may be
// null) is checked with the model. With `keep_previous`, a healthy save first
// keeps the file it replaces (keep_as_previous).
StateHealth save_checkpoint(const std::string& path, const TrainableModel& model, int64_t step,
                            const ResumeState* resume = nullptr, const torch::optim::Optimizer* optimizer = nullptr,
                            double loss = std::numeric_limits<double>::quiet_NaN(), bool keep_previous = false);
// The health a checkpoint recorded; nullopt for files from before nanscope recorded it.
std::optional<CheckpointHealth> checkpoint_health(const std::string& path);
// Copies the checkpoint's tensors into the model; throws std::invalid_argument
// (or format::FormatError) when the file does not belong to this model.
int64_t load_checkpoint(const std::string& path, TrainableModel& model);
// The /training group of a checkpoint; nullopt for one written without it.
std::optional<ResumeState> load_resume_state(const std::string& path);
// The number of steps done when the checkpoint was saved (its `step`
// attribute), without reading its tensors.
int64_t checkpoint_step(const std::string& path);

// Several ranks write their checkpoints in the same round, but a kill can land
// while some have renamed their new one into place and others have not. Each
// rank therefore keeps the checkpoint before its newest: a resume then finds a
// step every rank still has. X.h5 -> X.previous.h5.
std::string previous_checkpoint_path(const std::string& path);
// Keeps PATH's checkpoint as previous_checkpoint_path(PATH) before a new one
// replaces it. A hard link then a rename: PATH itself is never missing, and a
// kill leaves either the old previous or the new one whole. Nothing when PATH
// does not exist.
void keep_as_previous(const std::string& path);

// Periodic checkpoints kept by their step (nanscope-train --keep-checkpoints),
// so a search after the run (--search-doom) can replay from one before the
// step that doomed it: X.h5 -> X.step-0000040.h5 (40 steps done).
std::string step_checkpoint_path(const std::string& path, int64_t steps_done);
// Links PATH's checkpoint as step_checkpoint_path(PATH, steps_done) (a hard
// link: no second copy where the file system has them) and removes the
// oldest of those beyond `keep`.
void keep_by_step(const std::string& path, int64_t steps_done, int64_t keep);
// The checkpoints kept by step beside PATH: (steps done, path), oldest first.
std::vector<std::pair<int64_t, std::string>> checkpoints_kept_by_step(const std::string& path);

}  // namespace nanscope
