#include "op_arguments.hpp"

namespace nanscope::probe {

namespace {

// The last `own` values of `all`; all of them when the schema is unknown or
// variadic, or claims more than there are.
c10::ArrayRef<const c10::IValue> last(c10::ArrayRef<const c10::IValue> all, std::optional<size_t> own) {
  if (!own || *own >= all.size()) return all;
  return all.slice(all.size() - *own);
}

}  // namespace

c10::ArrayRef<const c10::IValue> op_arguments(const at::RecordFunction& fn) {
  const auto schema = fn.operator_schema();
  std::optional<size_t> own;
  if (schema && !schema->is_vararg()) own = schema->arguments().size();
  return last(fn.inputs(), own);
}

c10::ArrayRef<const c10::IValue> op_results(const at::RecordFunction& fn) {
  const auto schema = fn.operator_schema();
  std::optional<size_t> own;
  if (schema && !schema->is_varret()) own = schema->returns().size();
  const std::vector<c10::IValue>& outputs = fn.outputs();
  return last(c10::ArrayRef<const c10::IValue>(outputs.data(), outputs.size()), own);
}

}  // namespace nanscope::probe
