#include "bisect.hpp"

#include <algorithm>

#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/scripted_fp32_regions.hpp"

namespace nanscope::replay {

namespace {

// Re-runs the step with some modules in fp32, as the model's kind allows.
class Fp32Trial {
 public:
  explicit Fp32Trial(ReplaySetup& setup) : setup_(setup), scripted_(!setup.snapshot.torchscript_bytes.empty()) {}

  // The modules the forward runs ops in, first-seen order (containers that
  // run no op of their own are not listed: switching one is switching its
  // children).
  std::vector<std::string> modules() {
    probe::OpCapture capture;  // only to learn which modules the forward runs ops in
    run_step();
    return capture.modules_seen();
  }

  bool finite_with(const std::vector<std::string>& modules) {
    if (!scripted_) {
      probe::Fp32Regions regions(modules);
      return run_step();
    }
    probe::ScriptedFp32Regions regions(modules);
    const bool finite = run_step();
    unswitchable_ |= !regions.entered();
    return finite;
  }

  // A TorchScript re-run entered none of the chosen modules' frames: the
  // model's modules cannot be switched, and no answer can be trusted.
  bool unswitchable() const { return unswitchable_; }

 private:
  bool run_step() {
    try {
      return step_is_finite(setup_, setup_.amp, setup_.snapshot.inputs, setup_.snapshot.targets);
    } catch (const std::exception&) {
      return false;  // e.g. a region whose inputs arrive in a dtype its ops reject
    }
  }

  ReplaySetup& setup_;
  bool scripted_;
  bool unswitchable_ = false;
};

std::vector<std::string> one_minimal_set(Fp32Trial& trial, const ReplaySetup& setup) {
  std::vector<std::string> candidates = trial.modules();
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
  for (const auto& module : singles) {
    if (trial.unswitchable()) return {};
    if (trial.finite_with({module})) return {module};
  }
  if (!trial.finite_with(candidates)) return {};
  // Greedy 1-minimisation, outer modules first (fewest dots) so the innermost
  // modules that matter are what remains.
  std::stable_sort(candidates.begin(), candidates.end(), [](const std::string& a, const std::string& b) {
    return std::count(a.begin(), a.end(), '.') < std::count(b.begin(), b.end(), '.');
  });
  std::vector<std::string> kept = candidates;
  for (const auto& module : candidates) {
    if (trial.unswitchable()) return {};
    std::vector<std::string> without;
    for (const auto& m : kept)
      if (m != module) without.push_back(m);
    if (trial.finite_with(without)) kept = without;
  }
  return kept;
}

}  // namespace

Fp32RegionSearch smallest_fp32_region(ReplaySetup& setup) {
  Fp32Trial trial(setup);
  Fp32RegionSearch search;
  search.modules = one_minimal_set(trial, setup);
  if (trial.unswitchable()) {
    search.outcome = Fp32Search::unsupported;
    search.modules.clear();
  } else {
    search.outcome = search.modules.empty() ? Fp32Search::none_found : Fp32Search::found;
  }
  return search;
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
    } catch (const std::exception&) {}
  }
  // Every row "fixing" it means the batch size, not a sample, is what matters.
  if (int64_t(found.size()) == batch) found.clear();
  return found;
}

}  // namespace nanscope::replay
