#include "bisect.hpp"

#include <algorithm>

#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope::replay {

namespace {

bool finite_with_fp32(ReplaySetup& setup, const std::vector<std::string>& modules) {
  probe::Fp32Regions regions(modules);
  try {
    return step_is_finite(setup, setup.amp, setup.snapshot.inputs, setup.snapshot.targets);
  } catch (const std::exception&) {
    return false;  // e.g. a region whose inputs arrive in a dtype its ops reject
  }
}

}  // namespace

std::vector<std::string> smallest_fp32_region(ReplaySetup& setup) {
  std::vector<std::string> candidates;
  {
    probe::OpCapture capture;  // only to learn which module scopes the forward opens
    try {
      step_is_finite(setup, setup.amp, setup.snapshot.inputs, setup.snapshot.targets);
    } catch (const std::exception&) {
    }
    candidates = capture.modules_seen();
  }
  if (candidates.empty()) return {};
  // One module is the smallest set there is: try the birth's module first,
  // then the others innermost first. (Single regions also avoid a trap of
  // nesting: a region inside an autocast region receives low-precision inputs
  // its fp32 ops may reject.)
  std::vector<std::string> singles = candidates;
  std::stable_sort(singles.begin(), singles.end(), [](const std::string& a, const std::string& b) {
    return std::count(a.begin(), a.end(), '.') > std::count(b.begin(), b.end(), '.');
  });
  if (const auto& birth = setup.snapshot.capture.first_birth) {
    auto it = std::find(singles.begin(), singles.end(), birth->op.module);
    if (it != singles.end()) std::rotate(singles.begin(), it, it + 1);
  }
  for (const auto& module : singles)
    if (finite_with_fp32(setup, {module})) return {module};
  if (!finite_with_fp32(setup, candidates)) return {};
  // Greedy 1-minimisation, outer modules first (fewest dots) so the innermost
  // modules that matter are what remains.
  std::stable_sort(candidates.begin(), candidates.end(), [](const std::string& a, const std::string& b) {
    return std::count(a.begin(), a.end(), '.') < std::count(b.begin(), b.end(), '.');
  });
  std::vector<std::string> kept = candidates;
  for (const auto& module : candidates) {
    std::vector<std::string> without;
    for (const auto& m : kept)
      if (m != module) without.push_back(m);
    if (finite_with_fp32(setup, without)) kept = without;
  }
  return kept;
}

std::vector<int64_t> samples_without_which_finite(ReplaySetup& setup) {
  const at::Tensor& inputs = setup.snapshot.inputs;
  const at::Tensor& targets = setup.snapshot.targets;
  const int64_t batch = inputs.size(0);
  std::vector<int64_t> found;
  for (int64_t i = 0; i < batch; ++i) {
    at::Tensor keep = at::cat({at::arange(0, i, at::kLong), at::arange(i + 1, batch, at::kLong)});
    try {
      if (step_is_finite(setup, setup.amp, inputs.index_select(0, keep), targets.index_select(0, keep)))
        found.push_back(i);
    } catch (const std::exception&) {
    }
  }
  // Every row "fixing" it means the batch size, not a sample, is what matters.
  if (int64_t(found.size()) == batch) found.clear();
  return found;
}

}  // namespace nanscope::replay
