#pragma once
// Checkpoints are nanscope HDF5 files (kind nanscope-checkpoint): the model's
// spec and its parameters and buffers by name, readable with h5py.
#include <cstdint>
#include <string>

#include "nanscope/core/model.hpp"

namespace nanscope {

// Writes to PATH.tmp and renames, so a crash never leaves half a checkpoint.
void save_checkpoint(const std::string& path, const TrainableModel& model, int64_t step);
// Copies the checkpoint's tensors into the model; throws std::invalid_argument
// (or format::FormatError) when the file does not belong to this model.
int64_t load_checkpoint(const std::string& path, TrainableModel& model);

}  // namespace nanscope
