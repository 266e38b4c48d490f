#pragma once
// The optimizers nanscope-train builds (--optimizer; make_optimizer.hpp), as
// words without LibTorch for its option parsing.
#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

#define NANSCOPE_OPTIMIZERS(X) X(adamw, "adamw") X(sgd, "sgd")
NANSCOPE_DECLARE_WORDS_IN(format::Words, OptimizerKind, NANSCOPE_OPTIMIZERS)

}  // namespace nanscope
