#include "nanscope/core/snapshot_policy.hpp"

#include "nanscope/common/list_text.hpp"

namespace nanscope {

// A re-run that found no birth (transient) or failed is one story too, and
// so are weights that held the NaN/Inf already.
std::string birth_key(const format::Capture& c) {
  if (!c.nonfinite_weights.empty()) return "nonfinite-weights\n" + first_few_text(c.nonfinite_weights);
  if (!c.first_birth) return c.ops_seen < 0 ? "rerun-failed" : "not-reproduced";
  const format::Birth& b = *c.first_birth;
  return std::string(format::to_string(b.kind)) + '\n' + b.op.op + '\n' + b.op.module;
}

SnapshotPolicy::Decision SnapshotPolicy::decide(int64_t step, const format::Capture& capture) {
  Decision d;
  const std::string key = birth_key(capture);
  if (auto seen = step_of_birth_.find(key); seen != step_of_birth_.end()) {
    d.why_not = "same first birth as the snapshot of step " + std::to_string(seen->second);
  } else if (int64_t(step_of_birth_.size()) >= max_snapshots_) {
    d.why_not = "--max-snapshots " + std::to_string(max_snapshots_) + " reached";
  } else {
    d.write = true;
    step_of_birth_.emplace(key, step);
    return d;
  }
  ++skipped_;
  d.why_not += " (" + std::to_string(skipped_) + " skipped so far)";
  return d;
}

}  // namespace nanscope
