#pragma once
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

}  // namespace nanscope::probe
