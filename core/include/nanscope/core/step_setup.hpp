#pragma once
// What a harness does to the model for one step and every re-run of it (the
// forensic re-run, a diagnosis's re-runs, the doom search's replays), so that
// each run of the step meets what the step met: nanscope-train plants its
// --fault faults so. The guard knows no fault; a loop of yours needs none.
#include <cstdint>
#include <functional>

namespace nanscope {

// Called with true before the model runs the step, false after (also when the run throws).
using StepSetup = std::function<void(bool in_step)>;
// The one hook a harness installs on the guard (StepGuard::set_step_setup):
// the setup of a step, by number (an empty one: nothing to do).
using StepSetupHook = std::function<StepSetup(int64_t step)>;

// `setup` in force while in scope.
class ScopedStepSetup {
 public:
  explicit ScopedStepSetup(const StepSetup& setup) : setup_(setup) {
    if (setup_) setup_(true);
  }
  ~ScopedStepSetup() {
    if (setup_) setup_(false);
  }
  ScopedStepSetup(const ScopedStepSetup&) = delete;
  ScopedStepSetup& operator=(const ScopedStepSetup&) = delete;

 private:
  const StepSetup& setup_;
};

}  // namespace nanscope
