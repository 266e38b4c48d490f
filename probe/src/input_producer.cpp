#include "nanscope/probe/input_producer.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "nanscope/probe/birth_category.hpp"

namespace nanscope::probe {

namespace {

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The same values, to within `tolerance` relative to their size: a reshape
// between the two (a view, which capture does not record) keeps the count.
bool holds_values_of(const format::TensorStats& output, const format::TensorStats& input, double tolerance) {
  if (element_count(output.shape) != element_count(input.shape) || output.nan_count != input.nan_count ||
      output.inf_count != input.inf_count)
    return false;
  auto close = [&](double a, double b) {
    return a == b || std::fabs(a - b) <= tolerance * std::max(std::fabs(a), std::fabs(b));
  };
  return close(output.min, input.min) && close(output.max, input.max);
}

// Ops whose output holds their input's values, the same count, in another
// type, layout or shape: a value is followed through them to the op that made it.
bool is_copy(const std::string& op) {
  static const std::set<std::string> copies{"to",        "_to_copy", "copy",       "type_as",   "contiguous",
                                            "clone",     "reshape",  "view",       "flatten",   "permute",
                                            "transpose", "t",        "squeeze",    "unsqueeze", "_reshape_alias",
                                            "movedim",   "view_as",  "reshape_as", "double",    "float"};
  return copies.count(probe::bare_op_name(op)) > 0;
}

}  // namespace

std::optional<format::OpRecord> input_producer(const format::Birth& birth, const std::vector<format::OpRecord>& trail,
                                               size_t input) {
  if (input >= birth.inputs.size()) return std::nullopt;
  format::TensorStats wanted = birth.inputs[input];
  // An in-place op (log_) overwrote its input, and the producer's output with
  // it: the producer's trail statistics are the birth's output's.
  const bool in_place = input == 0 && !birth.op.op.empty() && birth.op.op.back() == '_';
  // bf16 keeps 8 significant bits: a value cast down and back is within 2^-8.
  double tolerance = 0;
  int64_t before = birth.op.index;
  std::optional<format::OpRecord> found;
  for (auto it = trail.rbegin(); it != trail.rend(); ++it) {
    if (it->index >= before) continue;  // the birth itself, or an op it took over
    const bool match = holds_values_of(it->output, wanted, tolerance) ||
                       (in_place && !found && holds_values_of(it->output, birth.op.output, 0));
    if (!match) continue;
    found = *it;
    if (!is_copy(it->op)) break;
    wanted = it->output;
    tolerance = 1.0 / 256;
    before = it->index;
  }
  return found;
}

std::optional<format::OpRecord> affine_source(const format::OpRecord& made, const std::vector<format::OpRecord>& trail,
                                              double scale, double shift) {
  format::TensorStats wanted = made.output;
  for (auto it = trail.rbegin(); it != trail.rend(); ++it) {
    if (it->index >= made.index) continue;
    // The same values as `made`'s own: the op inside it (rsub runs sub), or a
    // tensor whose values map onto themselves ([0, 1] under 1 - x): no evidence.
    if (holds_values_of(it->output, wanted, 0)) continue;
    format::TensorStats mapped = it->output;
    const double a = scale * it->output.min + shift, b = scale * it->output.max + shift;
    mapped.min = std::min(a, b);
    mapped.max = std::max(a, b);
    if (!holds_values_of(mapped, wanted, 1.0 / 256)) continue;
    // Through the casts, copies and reshapes in between, to the op that made the values.
    format::OpRecord source = *it;
    for (auto earlier = it + 1; earlier != trail.rend() && is_copy(source.op); ++earlier)
      if (holds_values_of(earlier->output, source.output, 1.0 / 256)) source = *earlier;
    return source;
  }
  return std::nullopt;
}

}  // namespace nanscope::probe
