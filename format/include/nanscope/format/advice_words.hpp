#pragma once
// The words advice is written in, for whoever ran the loop (a run's or a
// snapshot's @origin): nanscope-train's flags; the C++ library's GuardOptions
// fields and LibTorch's C++ names; the Python module's keyword arguments and
// torch's Python names. A fix the user cannot type as it is printed (a Python
// assert in a C++ loop, a flag for a loop that has no command line) is half a
// fix. replay's suggestions and the viewer's hints take every name from the
// one row of their origin, so a new origin or option is a column here, not an
// `if` in each text.
#include <string>
#include <vector>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

struct AdviceWords {
  // How an option is set, before one of the settings below: "train with"
  // (a flag), "set" (a GuardOptions field), "use" (a StepGuard call).
  const char* set;
  // Settings, each whole as the user writes it.
  const char* act_absmax_every;  // every N steps: "--act-absmax-every N"
  const char* amp_bf16;          // "--amp bf16"
  const char* fallback_auto;     // "--fallback auto"
  const char* probe_off;         // "--probe off"
  const char* doom_search_on;    // "--doom-search on"
  // A list of module paths (fp32_modules_setting() spells one).
  const char* fp32_modules_open;
  const char* fp32_modules_quote;
  const char* fp32_modules_separator;
  const char* fp32_modules_close;
  // Code: the functions a fix calls, and the check at the data boundary
  // (`x` the sample, `i` its index).
  const char* log_softmax;
  const char* cross_entropy;
  const char* logsigmoid;
  const char* bce_with_logits;
  const char* softmax;
  const char* logsumexp;
  const char* softplus;
  const char* check_finite;
  // How a snapshot of this origin is replayed: the command before and after
  // its path (a Python model is rebuilt by the user's factory, a C++ model by
  // the user's own program).
  const char* replay_before;
  const char* replay_after;
};

// The row of `origin`; unknown (a file from before format 1.2) reads as
// nanscope-train, the only writer there was.
const AdviceWords& advice_words(Origin origin);

// "--fp32-modules a.b,c", "GuardOptions::fp32_modules = {\"a.b\", \"c\"}",
// "nanscope.GuardConfig(fp32_modules=[\"a.b\", \"c\"])".
std::string fp32_modules_setting(Origin origin, const std::vector<std::string>& modules);

// "train with --act-absmax-every N", "set GuardOptions::act_absmax_every = N", ...
std::string how_to_set(Origin origin, const std::string& setting);

// The command that replays `snapshot`: "nanscope-replay PATH", "python3 -m
// nanscope replay PATH --model MODULE:FACTORY --loss MODULE:LOSS_FN", ...;
// `python`: the interpreter a Python run was trained with, in place of python3.
std::string replay_command(Origin origin, const std::string& snapshot, const std::string& python = "");

}  // namespace nanscope::format
