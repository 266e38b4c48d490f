#pragma once
#include <CLI/App.hpp>

#include "options.hpp"

namespace nanscope {

// Declares every nanscope-train flag on `app`, bound to `options`. Validation
// that needs more than one flag happens in validate_options().
void add_train_options(CLI::App& app, TrainOptions& options);
// Throws std::invalid_argument with a message for the user.
void validate_options(const TrainOptions& options);

}  // namespace nanscope
