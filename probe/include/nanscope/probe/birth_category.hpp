#pragma once
// Which arithmetic origin (playbook P8-P18) a first birth belongs to, read
// from the birth's own evidence: the op, its phase and backward node, its
// inputs' statistics. nanscope-replay's verdict and the step guard's
// --fallback auto both classify a birth by it.
#include <string>

#include "nanscope/format/capture.hpp"

namespace nanscope::probe {

format::Category category_of(const format::Birth& birth);

// "aten::log_" -> "log": the op's name without namespace or in-place mark.
std::string bare_op_name(const std::string& op);

}  // namespace nanscope::probe
