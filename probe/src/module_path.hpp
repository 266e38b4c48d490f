#pragma once
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <vector>

namespace nanscope::probe {

// torch::jit::currentModuleHierarchy() frames -> the dotted path that
// named_modules() uses. Frames look like "TOP(Net)::forward",
// "0(Block)::forward", "SELF(Block)::helper", "CALL_FUNCTION::bce()::bce" or
// "::bce" (a free function: the op belongs to the module that called it). With
// the model registered (torchscript_modules.hpp) each module frame is resolved
// in its module tree: the descendant of the path so far with that last name and
// class, through the containers and attributes the frames leave out. The root
// (and an empty hierarchy) is "".
std::string dotted_module_path(const std::vector<std::string>& hierarchy);

// The named_modules() path of a registered TorchScript model's module, given
// the module object (a method frame's `self`); nullopt for anything else.
std::optional<std::string> registered_module_path(const c10::IValue& self);

// The module running the current op on this thread: the innermost native
// NANSCOPE_MODULE_SCOPE, else the TorchScript interpreter's call stack, else "".
std::string current_module_path();

}  // namespace nanscope::probe
