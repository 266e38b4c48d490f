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

bool is_copy(const std::string& op) {
  static const std::set<std::string> copies{"to", "_to_copy", "copy", "type_as", "contiguous", "clone"};
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

}  // namespace nanscope::probe
