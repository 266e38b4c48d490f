#pragma once
// Checkpoints are nanscope HDF5 files (kind nanscope-checkpoint): the model's
// spec and its parameters and buffers by name, readable with h5py.
#include <cstdint>
#include <string>

#include <ATen/ATen.h>

#include <optional>

#include "nanscope/core/model.hpp"
#include "nanscope/core/step_guard.hpp"

namespace nanscope {

// What --resume needs besides the weights: the optimizer's state, the CPU
// random generator, and the step guard's precision, scaler and backoffs.
struct ResumeState {
  NamedTensors optimizer_state;  // optimizer_state_by_name(): the optimizer's own tensors, streamed out
  at::Tensor cpu_rng;
  GuardState guard;
};

// Writes PATH.part and renames it over PATH, so a crash never leaves half a checkpoint.
// With `resume`, the checkpoint can also continue the run (/training).
void save_checkpoint(const std::string& path, const TrainableModel& model, int64_t step,
                     const ResumeState* resume = nullptr);
// Copies the checkpoint's tensors into the model; throws std::invalid_argument
// (or format::FormatError) when the file does not belong to this model.
int64_t load_checkpoint(const std::string& path, TrainableModel& model);
// The /training group of a checkpoint; nullopt for one written without it.
std::optional<ResumeState> load_resume_state(const std::string& path);

}  // namespace nanscope
