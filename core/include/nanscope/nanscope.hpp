#pragma once
// Everything a training loop of your own uses, in one include:
//   nanscope::StepGuard         the guarded step (step_guard.hpp)
//   nanscope::GuardOptions      what it is told (guard_options.hpp)
//   nanscope::ModuleModel       a module and its loss as one model (module_model.hpp)
//   NANSCOPE_MODULE_SCOPE       exact module names where you want them (module_scope.hpp)
//   nanscope::save_checkpoint   a save that refuses a sick model (checkpoint.hpp)
// Replaying a snapshot from your own program is nanscope::replay
// (nanscope/replay/model_registry.hpp, target nanscope::replay).
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/closure_model.hpp"
#include "nanscope/core/guard_options.hpp"
#include "nanscope/core/module_model.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/probe/module_scope.hpp"
