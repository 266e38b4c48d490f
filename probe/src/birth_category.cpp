#include "nanscope/probe/birth_category.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <limits>
#include <set>
#include <vector>

namespace nanscope::probe {

std::string bare_op_name(const std::string& op) {
  std::string name = op.rfind("aten::", 0) == 0 ? op.substr(6) : op;
  if (!name.empty() && name.back() == '_') name.pop_back();  // in-place variants
  return name;
}

namespace {

// The divisor's stats (min and max over its finite values) span 0. A 0/0 NaN
// or x/0 Inf needs a zero there; a divisor of one sign cannot be zero.
bool divisor_can_be_zero(const std::string& op, const format::Birth& b) {
  const size_t divisor = op == "div" ? 1 : 0;
  if (b.inputs.size() <= divisor) return true;  // not recorded: keep the usual reading
  const format::TensorStats& d = b.inputs[divisor];
  return d.min <= 0 && d.max >= 0;
}

// The largest finite value of a recorded dtype name (c10's spelling).
double largest_finite(const std::string& dtype) {
  if (dtype == "Half") return static_cast<double>(std::numeric_limits<c10::Half>::max());
  if (dtype == "BFloat16") return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
  if (dtype == "Double") return std::numeric_limits<double>::max();
  return std::numeric_limits<float>::max();
}

// A product of two finite inputs that passes the output type's range: each
// term of the dot product overflows. The sum of such terms is inf, or NaN where
// their signs mix (inf - inf); which one depends on how the CPU's kernel adds
// (one fused multiply-add at a time or not), so both are the overflow.
bool products_pass_range(const std::string& op, const format::Birth& b) {
  static const std::set<std::string> products{
      "matmul",   "mm",     "bmm",    "addmm",  "baddbmm", "addbmm",      "linear",       "mv",
      "dot",      "einsum", "conv1d", "conv2d", "conv3d",  "convolution", "_convolution", "mkldnn_convolution",
      "tensordot"};
  if (!products.count(op)) return false;
  std::vector<double> sizes;
  for (const auto& in : b.inputs)
    if (in.dtype != "scalar" && in.nan_count == 0 && in.inf_count == 0) sizes.push_back(in.absmax);
  std::sort(sizes.rbegin(), sizes.rend());
  return sizes.size() >= 2 && sizes[0] * sizes[1] > largest_finite(b.op.output.dtype);
}

}  // namespace

format::Category category_of(const format::Birth& b) {
  if (b.op.phase == format::Phase::input) return format::Category::nonfinite_input;
  if (b.op.phase == format::Phase::grad_norm) return format::Category::grad_explosion;
  if (b.op.backward_node == "SqrtBackward0" && b.op.site != format::OpSite::gradient_hook)
    return format::Category::sqrt_grad_zero;
  if (b.kind == format::BirthKind::nan && b.counted_targets == 0) return format::Category::all_targets_ignored;
  const std::string op = bare_op_name(b.op.op);
  // log of a negative is NaN, log of exactly 0 is -inf (a bf16 sigmoid rounded to 1.0 in 1 - p).
  static const std::set<std::string> logs{"log", "log2", "log10", "log1p", "xlogy"};
  if (logs.count(op)) return format::Category::log_nonpositive;
  // log_softmax takes logits, not probabilities: nothing it is given is "not
  // positive", and clamping its input is no fix. Its NaN (none came in) is a
  // row of -inf logits, as softmax's is; its infinity, from finite logits,
  // is their spread past the type's range.
  if (op == "log_softmax" || op == "_log_softmax")
    return b.kind == format::BirthKind::nan ? format::Category::fully_masked_softmax : format::Category::overflow;
  if (b.kind == format::BirthKind::nan && (op == "softmax" || op == "_softmax"))
    return format::Category::fully_masked_softmax;
  if (op == "exp" || op == "exp2" || op == "expm1") return format::Category::exp_overflow;
  if (op == "div" || op == "reciprocal" || op == "rsqrt") {
    // Infinities coming in (inf / inf) were made upstream; only a divisor that
    // can be zero is a division by zero, and a finite quotient that grew past
    // the type's range is an overflow.
    for (const auto& in : b.inputs)
      if (in.inf_count > 0) return format::Category::overflow;
    return divisor_can_be_zero(op, b) ? format::Category::div_by_zero : format::Category::overflow;
  }
  if (b.kind == format::BirthKind::inf || products_pass_range(op, b)) return format::Category::overflow;
  return format::Category::other;
}

}  // namespace nanscope::probe
