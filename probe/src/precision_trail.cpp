#include "nanscope/probe/precision_trail.hpp"

#include <ATen/ops/abs.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace nanscope::probe {

namespace {

// An fp32 op is looked for among this many kept ops from the first one not
// yet paired: ops of one run only (casts) come singly or in pairs.
constexpr size_t kLookahead = 32;

struct TypeLimits {
  int mantissa_bits;  // stored significand bits
  int min_exponent;   // of the smallest normal number
  const char* name;
};

TypeLimits limits_of(at::ScalarType low) {
  switch (low) {
    case at::kHalf: return {10, -14, "float16"};
    case at::kBFloat16: return {7, -126, "bfloat16"};
    default: return {23, -126, "float32"};
  }
}

// The spacing of the low type's numbers at `magnitude` (its subnormals' below
// the smallest normal).
double ulp_at(double magnitude, const TypeLimits& type) {
  const int exponent = magnitude > 0 && std::isfinite(magnitude) ? std::ilogb(magnitude) : type.min_exponent;
  return std::ldexp(1.0, std::max(exponent, type.min_exponent) - type.mantissa_bits);
}

size_t bytes_of(const at::Tensor& t) { return size_t(t.numel()) * t.element_size(); }

}  // namespace

PrecisionTrailRecorder::PrecisionTrailRecorder(at::ScalarType low, double loss_scale, size_t budget_bytes)
    : low_(low), loss_scale_(loss_scale), budget_(budget_bytes) {}

OpOutputSink PrecisionTrailRecorder::low_precision_run() {
  return [this](const format::OpRecord& op, const at::Tensor& output) { keep(op, output); };
}

OpOutputSink PrecisionTrailRecorder::fp32_run() {
  next_ = 0;
  return [this](const format::OpRecord& op, const at::Tensor& output) { compare(op, output); };
}

void PrecisionTrailRecorder::keep(const format::OpRecord& op, const at::Tensor& output) {
  if (!keeping_) return;
  if (bytes_ + bytes_of(output) > budget_) {
    keeping_ = false;
    budget_ran_out_at_ = op.index;
    return;
  }
  // A copy: a later in-place op would change the output under us.
  kept_.push_back({op, output.detach().clone(), std::nullopt});
  bytes_ += bytes_of(output);
  // Past a NaN nothing is compared (the trail ends at the birth, and every
  // later op of the low-precision run differs from fp32 by NaN).
  if (at::isnan(output).any().item<bool>()) keeping_ = false;
}

void PrecisionTrailRecorder::compare(const format::OpRecord& op, const at::Tensor& output) {
  for (size_t j = next_; j < kept_.size() && j < next_ + kLookahead; ++j) {
    Kept& k = kept_[j];
    if (k.op.op != op.op || k.op.phase != op.phase || k.op.module != op.module ||
        k.op.backward_node != op.backward_node || !k.output.sizes().equals(output.sizes()))
      continue;
    const TypeLimits type = limits_of(low_);
    const at::ScalarType wide = output.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const at::Tensor ref = output.detach().to(wide);
    at::Tensor low = k.output.to(ref.device(), wide);
    if (op.phase == format::Phase::backward && loss_scale_ != 1.0) low = low / loss_scale_;
    format::OpError e;
    e.op = k.op;
    e.op.output = {};
    if (ref.numel() > 0) {
      const at::Tensor ref_finite = at::isfinite(ref);
      const at::Tensor both = ref_finite.logical_and(at::isfinite(low));
      e.nonfinite = ref_finite.logical_and(both.logical_not()).sum().item<int64_t>();
      const at::Tensor diff = (low - ref).abs().masked_fill(both.logical_not(), 0);
      e.max_abs = diff.max().item<double>();
      const double scale = ref.abs().masked_fill(ref_finite.logical_not(), 0).max().item<double>();
      const double ulp = ulp_at(scale, type);
      e.ulps = e.nonfinite > 0 ? std::numeric_limits<double>::infinity() : e.max_abs / ulp;
      // Relative to fp32's value where the low type tells it from zero at the
      // op's scale: below that, a value is rounding noise and its relative
      // error says nothing (a centred row's near-zero entries).
      const at::Tensor magnitude = ref.abs();
      const at::Tensor resolved = both.logical_and(magnitude >= ulp);
      e.max_rel = (diff / magnitude.clamp_min(ulp)).masked_fill(resolved.logical_not(), 0).max().item<double>();
    }
    k.error = e;
    next_ = j + 1;
    return;
  }
}

format::PrecisionTrail PrecisionTrailRecorder::result(int64_t birth_index) const {
  format::PrecisionTrail t;
  t.type = limits_of(low_).name;
  // Up to the outermost op that ends at or after the birth: the birth's op
  // itself, or the op its code called that holds it (autocast's cast inside
  // a linear, which overflowed: the linear is what the trail can compare).
  for (const Kept& k : kept_) {
    if (k.error)
      t.ops.push_back(*k.error);
    else
      ++t.unmatched;
    if (birth_index >= 0 && k.op.index >= birth_index) break;
  }
  if (budget_ran_out_at_ >= 0 && (birth_index < 0 || budget_ran_out_at_ <= birth_index)) {
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.3g", double(budget_) / double(1 << 20));
    t.cut_short = std::string("the low-precision run's outputs filled the trail's ") + mib + " MiB at op " +
                  std::to_string(budget_ran_out_at_) + ": the ops after it were not compared";
  }
  t.first_lost = format::first_precision_loss(t.ops, t.margin_ulps);
  return t;
}

}  // namespace nanscope::probe
