#include "module_path.hpp"

namespace nanscope::probe {

std::string dotted_module_path(const std::vector<std::string>& hierarchy) {
  std::string path;
  for (size_t i = 1; i < hierarchy.size(); ++i) {  // entry 0 is the top-level module
    std::string name = hierarchy[i];
    if (auto paren = name.find('('); paren != std::string::npos) name.resize(paren);
    if (name.empty()) continue;
    path += (path.empty() ? "" : ".") + name;
  }
  return path;
}

}  // namespace nanscope::probe
