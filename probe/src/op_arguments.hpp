#pragma once
// An op's own arguments and results as a RecordFunction callback sees them.
//
// An op called through the boxed path (the TorchScript interpreter calls every
// op that way) hands RecordFunction the interpreter's whole stack as the op's
// inputs, and the whole stack again as its outputs: values a calling frame
// left below the op's arguments come first. In a traced model called from
// another module that stack holds weights and earlier activations, and a
// capture that read it whole judged an op by tensors it never touched. The op's
// schema says how many values are its own: the last ones.
#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>

#include <optional>

namespace nanscope::probe {

// How many values are the op's own; unknown (all of them) for an op without
// a schema or a variadic one. Reading the schema copies it: once per op, at
// its start, and kept for its end.
struct OpArity {
  std::optional<size_t> arguments, results;
};
OpArity op_arity(const at::RecordFunction& fn);

c10::ArrayRef<const c10::IValue> op_arguments(const at::RecordFunction& fn, const OpArity& arity);
c10::ArrayRef<const c10::IValue> op_results(const at::RecordFunction& fn, const OpArity& arity);

}  // namespace nanscope::probe
