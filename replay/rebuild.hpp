#pragma once
// Rebuilds a failing step from its snapshot alone: the model (by the factory
// registered for its name, model_registry.hpp) with the weights before the
// step, the batch, the RNG state, the precision and loss scale, and the setup
// the harness gave that step (nanscope-train's planted fault).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/model.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/probe/snapshot.hpp"

namespace nanscope::replay {

struct ReplaySetup {
  std::string path;
  probe::SnapshotContents snapshot;
  std::unique_ptr<TrainableModel> model;
  std::vector<at::Tensor> parameters;
  StepSetup step_setup;  // what each re-run of the step repeats (empty: nothing)
  Amp amp = Amp::fp32;
  // Modules that ran in fp32 inside the step's autocast (--fp32-modules,
  // --fallback auto): every re-run at the original precision keeps them so.
  std::vector<std::string> fp32_modules;
  bool unswitchable = false;  // a TorchScript re-run entered none of its fp32 modules' frames
  std::string rerun_error;    // what the last re-run that raised said (one line), or ""
  bool last_raised = false;   // the last step_is_finite raised: its false is no evidence of non-finite
  // A watched step's loss weight, read on the first re-run of the whole batch
  // (NaN: none could be read; fix_loss_weight): a re-run without a row takes it from there.
  std::optional<double> loss_weight;
};

// Throws format::FormatError (bad file) or std::invalid_argument (a snapshot
// this replay cannot rebuild), both naming the file.
ReplaySetup rebuild(const std::string& path);

// Runs forward + backward + unscale + the global grad norm of the step at
// `amp` on `batch` (the snapshot's, or it without a row), from the snapshot's RNG state. True when loss,
// gradients and norm are all finite. Never changes the weights or buffers.
// Below fp32, setup.fp32_modules and `more_fp32_modules` run in fp32.
bool step_is_finite(ReplaySetup& setup, Amp amp, const Batch& batch,
                    const std::vector<std::string>& more_fp32_modules = {});

// The step re-run in fp32 in earnest: step_is_finite at fp32, and a model of
// its own 16-bit weights (TrainableModel::own_16bit_type_name), which
// computes in them with autocast off too, widened to float32 for it (its
// 16-bit parameters and buffers, its other models' and the batch's, all
// exactly) and put back after. Throws as step_is_finite does.
bool step_is_finite_in_fp32(ReplaySetup& setup, const Batch& batch);
// step_is_finite at `amp` with the model's 16-bit weights (and the batch's)
// widened as above: whether widening alone fixes a step that ran under autocast.
bool step_is_finite_widened(ReplaySetup& setup, Amp amp, const Batch& batch);

}  // namespace nanscope::replay
