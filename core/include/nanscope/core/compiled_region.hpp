#pragma once
// Where a compiled program (torch.compile) and the model's own math part: a
// step that is non-finite compiled and finite when the same step runs eagerly
// points at the compiler, and this names the module to take out of the
// compiled program. The search compiles one module at a time, the rest of
// the model running eagerly: the smallest module that, compiled alone, makes
// the step non-finite is the region (descending from the root, children in
// their order). The region is a fix that was tried: that module compiled is
// enough to break the step, so running it eagerly (torch.compiler.disable) is
// what the user is told to do. A fault that needs several modules fused
// together is named by the smallest module holding them all, the root ("")
// when no child alone reproduces it.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/model.hpp"

namespace nanscope {

struct CompiledRegion {
  std::string module;         // dotted path; "" is the whole model
  int runs = 0;               // steps run by the search
  bool budget_spent = false;  // stopped at max_runs: `module` holds the region, maybe not the smallest
};

// `module_paths`: named_modules()'s paths, parents before children, the root
// "" included. `nonfinite_compiled_alone(path)` runs the step with only that
// module compiled and says whether it went non-finite (a run that raised is
// non-finite). The root is taken as known non-finite (the compiled step was).
CompiledRegion locate_compiled_region(const std::vector<std::string>& module_paths,
                                      const std::function<bool(const std::string&)>& nonfinite_compiled_alone,
                                      int max_runs = 48);

// A compiled model's step that eager re-runs found finite, checked against
// the compiled program: `step_nonfinite()` runs the step with capture off
// (so the model runs compiled) and says whether it went non-finite. When it
// did, the region is searched for with model.compiled_alone(); nullopt when
// the model cannot run one module compiled alone.
struct CompiledCheck {
  bool nonfinite = false;
  std::optional<CompiledRegion> region;
  double seconds = 0;  // the check and the search, wall time
};
CompiledCheck check_compiled_program(TrainableModel& model, const std::function<bool()>& step_nonfinite);

}  // namespace nanscope
