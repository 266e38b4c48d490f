#include "nanscope/core/compiled_region.hpp"

#include <chrono>

namespace nanscope {

namespace {

// The direct children of `parent` among `paths`, in their order.
std::vector<std::string> children_of(const std::vector<std::string>& paths, const std::string& parent) {
  const std::string prefix = parent.empty() ? "" : parent + ".";
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    if (p.empty() || p.size() <= prefix.size() || p.compare(0, prefix.size(), prefix) != 0) continue;
    if (p.find('.', prefix.size()) == std::string::npos) out.push_back(p);
  }
  return out;
}

}  // namespace

CompiledRegion locate_compiled_region(const std::vector<std::string>& module_paths,
                                      const std::function<bool(const std::string&)>& nonfinite_compiled_alone,
                                      int max_runs) {
  CompiledRegion region;
  for (bool descended = true; descended;) {
    descended = false;
    for (const std::string& child : children_of(module_paths, region.module)) {
      if (region.runs >= max_runs) {
        region.budget_spent = true;
        return region;
      }
      ++region.runs;
      if (nonfinite_compiled_alone(child)) {
        region.module = child;
        descended = true;
        break;
      }
    }
  }
  return region;
}

CompiledCheck check_compiled_program(TrainableModel& model, const std::function<bool()>& step_nonfinite) {
  const auto start = std::chrono::steady_clock::now();
  CompiledCheck check;
  check.nonfinite = step_nonfinite();
  if (check.nonfinite) {
    bool searchable = true;
    const CompiledRegion region = locate_compiled_region(model.module_paths(), [&](const std::string& path) {
      const std::shared_ptr<void> alone = model.compiled_alone(path);
      searchable = searchable && alone != nullptr;
      return searchable && step_nonfinite();
    });
    if (searchable) check.region = region;
  }
  check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return check;
}

}  // namespace nanscope
