#pragma once
// Planting nanscope-train's faults (--fault) in a model: the built-in gpt and
// mlp host them at real ops; the guard meets them only as a step's setup
// (core/step_setup.hpp), which the trainer installs.
#include <cstdint>

#include "nanscope/core/model.hpp"
#include "nanscope/core/step_setup.hpp"
#include "nanscope/models/fault.hpp"

namespace nanscope {

// A model that hosts planted faults. A test and demo facility, not part of
// the interface a model of yours implements.
class FaultHost {
 public:
  virtual ~FaultHost() = default;
  // Plants (or, with kind none, clears) a fault for the next forward.
  // Returns false when this model cannot host that fault kind.
  virtual bool plant_fault(const Fault& fault) = 0;
};

// Plants `fault` in `model` when it is a FaultHost; any other model hosts
// only kind none (nothing planted). False when the model cannot host it.
bool plant_fault(TrainableModel& model, const Fault& fault);

// The setup of a step that plants `fault` (the model's fault at that step,
// model_fault_at) in `model` for each run of the step; empty for kind none.
StepSetup planting(TrainableModel& model, const Fault& fault);

}  // namespace nanscope
