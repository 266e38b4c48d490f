#pragma once
// The words of nanscope-train's and the step guard's options, without
// LibTorch: the command line parses them beside the LibTorch batches. Each
// list is an X-macro, as format/vocabulary.hpp's are: the enum, its spellings
// and to_string come from one line per word.
#include <string>
#include <vector>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// What a non-finite step triggers (--fallback): nothing but the skip (off),
// the stock whole-model fp32 fallback with its LR cut (whole), or the remedy
// the step's own diagnosis supports (automatic: --fallback auto, remedy.hpp).
#define NANSCOPE_FALLBACK_MODES(X) X(off, "off") X(whole, "whole") X(automatic, "auto")
NANSCOPE_DECLARE_WORDS_IN(format::Words, FallbackMode, NANSCOPE_FALLBACK_MODES)
inline const char* fallback_mode_name(FallbackMode mode) { return to_string(mode); }

// What --fallback auto chose for a failed step (remedy.hpp says when each).
// One word per line: clang-format folds this list unstably.
// clang-format off
#define NANSCOPE_REMEDIES(X)             \
  X(none, "none")                        \
  X(skip_data, "data")                   \
  X(skip_transient, "transient")         \
  X(skip_compiler, "compiler")           \
  X(skip_undiagnosed, "undiagnosed")     \
  X(skip_model_or_data, "model_or_data") \
  X(fp32_modules, "fp32-modules")        \
  X(kernel, "kernel")                    \
  X(whole_fp32, "whole")
// clang-format on
NANSCOPE_DECLARE_WORDS_IN(format::Words, Remedy, NANSCOPE_REMEDIES)
inline const char* remedy_name(Remedy remedy) { return to_string(remedy); }

// "a.b,c": the spelling of --fp32-modules.
std::string fp32_modules_flag_value(const std::vector<std::string>& modules);
// Splits --fp32-modules' value; empty names and repeats are dropped.
std::vector<std::string> parse_fp32_modules(const std::string& text);

}  // namespace nanscope
