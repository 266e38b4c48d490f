#pragma once
#include <string>
#include <vector>

namespace nanscope::probe {

// torch::jit::currentModuleHierarchy() entries -> the dotted path that
// named_modules() uses: {"TOP(Net)", "encoder(Sequential)", "0(Linear)"} ->
// "encoder.0". The root (and an empty hierarchy) is "".
std::string dotted_module_path(const std::vector<std::string>& hierarchy);

}  // namespace nanscope::probe
