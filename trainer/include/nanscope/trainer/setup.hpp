#pragma once
// Builds what a run needs from its options: device, data, model. Every error
// here is the user's input (std::invalid_argument or format::FormatError).
#include <ATen/ATen.h>

#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include "nanscope/core/model.hpp"
#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

at::Device select_device(DeviceChoice requested);
// Threads, seeds, TF32 and determinism (P2, P19).
void configure_runtime(const TrainOptions& options, at::Device device);
Dataset make_dataset(const TrainOptions& options);
// The model fitted to the data (the mlp takes its widths from it).
std::unique_ptr<TrainableModel> make_model(const TrainOptions& options, const Dataset& data);
// The model from --model (and --init), on its device, ready to train.
std::unique_ptr<TrainableModel> prepared_model(const TrainOptions& options, const Dataset& data, at::Device device,
                                               std::ostream& log);
// The step's batch with the loop's planted faults (a NaN row, scaled inputs
// and targets), on the device: the run's and its replays' (--search-doom).
std::pair<at::Tensor, at::Tensor> planted_batch(const Dataset& data, const std::vector<Fault>& faults, int64_t step,
                                                const at::Tensor& rows, at::Device device);
// Rejects faults this model or data cannot host, and precisions this
// LibTorch/device cannot autocast to.
void check_compatibility(const TrainOptions& options, TrainableModel& model, const Dataset& data, at::Device device);

}  // namespace nanscope::trainer
