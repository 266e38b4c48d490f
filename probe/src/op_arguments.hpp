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

namespace nanscope::probe {

c10::ArrayRef<const c10::IValue> op_arguments(const at::RecordFunction& fn);
c10::ArrayRef<const c10::IValue> op_results(const at::RecordFunction& fn);

}  // namespace nanscope::probe
