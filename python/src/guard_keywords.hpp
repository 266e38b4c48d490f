#pragma once
// Python's StepGuard keywords, made from the guard options' one declaration
// (core/guard_option_list.hpp): nanscope.StepGuard's signature and help list
// them from guard_keyword_list(), and its keywords reach a GuardOptions here.
#include <torch/csrc/utils/pybind.h>

#include "nanscope/core/guard_options.hpp"

namespace nanscope::python {

// Sets every option `keywords` names. An unknown name raises TypeError (as a
// Python function does), a value of the wrong type TypeError, a value the
// option refuses ValueError; each message names the keyword.
void set_guard_keywords(GuardOptions& options, const pybind11::dict& keywords,
                        const std::string& who = "nanscope.StepGuard");

// Each option as a dict: name, default (a Python value), help (Python's
// spelling) and words (for the options that take a few words).
pybind11::list guard_keyword_list();

}  // namespace nanscope::python
