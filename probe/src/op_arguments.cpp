#include "op_arguments.hpp"

namespace nanscope::probe {

namespace {

// The last `own` values of `all`; all of them when `own` is unknown or claims
// more than there are.
c10::ArrayRef<const c10::IValue> last(c10::ArrayRef<const c10::IValue> all, std::optional<size_t> own) {
  if (!own || *own >= all.size()) return all;
  return all.slice(all.size() - *own);
}

}  // namespace

OpArity op_arity(const at::RecordFunction& fn) {
  OpArity arity;
  const auto schema = fn.operator_schema();
  if (!schema) return arity;
  if (!schema->is_vararg()) arity.arguments = schema->arguments().size();
  if (!schema->is_varret()) arity.results = schema->returns().size();
  return arity;
}

c10::ArrayRef<const c10::IValue> op_arguments(const at::RecordFunction& fn, const OpArity& arity) {
  return last(fn.inputs(), arity.arguments);
}

c10::ArrayRef<const c10::IValue> op_results(const at::RecordFunction& fn, const OpArity& arity) {
  const std::vector<c10::IValue>& outputs = fn.outputs();
  return last(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()), arity.results);
}

}  // namespace nanscope::probe
