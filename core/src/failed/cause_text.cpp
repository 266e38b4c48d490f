#include "nanscope/core/cause.hpp"

#include "nanscope/probe/birth_category.hpp"
#include "nanscope/probe/input_producer.hpp"

namespace nanscope {

std::string trigger_text(const format::Birth& birth, const std::vector<format::OpRecord>& trail) {
  const std::string op = probe::bare_op_name(birth.op.op);
  // xlogy(x, y) = x * log(y) and a division's divisor: the input that breaks it.
  const size_t input = op == "xlogy" || op == "div" ? 1 : 0;
  const std::optional<format::OpRecord> producer = probe::input_producer(birth, trail, input);
  return birth.op.op + " (" + format::to_string(birth.op.phase) + ") in module '" + birth.op.module + "' makes " +
         format::to_string(birth.kind) + (producer ? " of the output of " + producer->op : std::string()) + " (" +
         format::to_string(probe::category_of(birth)) + ")";
}

}  // namespace nanscope
