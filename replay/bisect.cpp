#include "bisect.hpp"

#include <algorithm>

#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/remedy.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope::replay {

namespace {

// Re-runs the snapshot's step with some modules in fp32.
class SnapshotFp32Trial : public Fp32Trial {
 public:
  explicit SnapshotFp32Trial(ReplaySetup& setup) : setup_(setup) {}

  // The modules the forward runs ops in, first-seen order (containers that
  // run no op of their own are not listed: switching one is switching its
  // children).
  std::vector<std::string> modules() override {
    probe::OpCapture capture;  // only to learn which modules the forward runs ops in
    run_step();
    return capture.modules_seen();
  }

  bool finite_with(const std::vector<std::string>& modules) override { return run_step(modules); }

  bool unswitchable() const override { return setup_.unswitchable; }

 private:
  // A trial that raised (e.g. a region whose inputs arrive in a dtype its ops
  // reject) is not finite; its error is not the step's, which the report quotes.
  bool run_step(const std::vector<std::string>& fp32_modules = {}) {
    const std::string step_error = setup_.rerun_error;
    const bool finite = step_is_finite(setup_, setup_.amp, setup_.snapshot.batch, fp32_modules);
    setup_.rerun_error = step_error;
    return finite;
  }

  ReplaySetup& setup_;
};

}  // namespace

Fp32RegionSearch smallest_fp32_region(ReplaySetup& setup) {
  SnapshotFp32Trial trial(setup);
  Fp32RegionSearch search;
  const auto& birth = setup.snapshot.capture.first_birth;
  search.modules = minimal_fp32_modules(trial, birth ? birth->op.module : std::string());
  if (trial.unswitchable()) {
    search.outcome = Fp32Search::unsupported;
    search.modules.clear();
  } else {
    search.outcome = search.modules.empty() ? Fp32Search::none_found : Fp32Search::found;
  }
  return search;
}

std::vector<int64_t> samples_without_which_finite(ReplaySetup& setup, bool replace) {
  const Batch& whole = setup.snapshot.batch;
  const int64_t batch = whole.rows();
  const auto& birth = setup.snapshot.capture.first_birth;
  const std::vector<int64_t> suspects = birth ? birth->rows : std::vector<int64_t>{};
  std::vector<int64_t> found;
  for (int64_t i = 0; i < batch; ++i) {
    const Batch tried = replace ? whole.with_row_replaced(i, donor_row(i, batch, suspects)) : whole.without_row(i);
    if (step_is_finite(setup, setup.amp, tried)) found.push_back(i);
  }
  // Every row "fixing" it means the batch size, not a sample, is what matters.
  if (int64_t(found.size()) == batch) found.clear();
  return found;
}

}  // namespace nanscope::replay
