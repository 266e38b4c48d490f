#pragma once
#include <CLI/App.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nanscope/trainer/options.hpp"

namespace nanscope::trainer {

// Declares every nanscope-train flag on `app`, bound to `options`. Validation
// that needs more than one flag happens in validate_options().
void add_train_options(CLI::App& app, TrainOptions& options);

// How the run config (run.h5's /config) records one of nanscope-train's own
// options: under `key`, the long flag name with '_' for '-'.
struct RecordedOption {
  std::string key;
  std::function<std::string(const TrainOptions&)> text;
};
using RecordedOptions = std::vector<RecordedOption>;
// nanscope-train's own options as the run records them, made from the one
// declaration add_train_options makes: every one but how the process was
// asked to run (recorded_in_run_config). The guard's options are recorded by
// the guard, from its own list.
std::map<std::string, std::string> recorded_options(const TrainOptions& options);
// False for the flags that say how this process was asked to run (--config,
// --resume, --search-doom and its settings), by run config key.
bool recorded_in_run_config(const std::string& key);
// Throws std::invalid_argument with a message for the user.
void validate_options(const TrainOptions& options);
// Defaults that follow from other flags: --resume's run directory, the
// checkpoint path of --checkpoint-every without --save.
void apply_defaults(TrainOptions& options);

// The options a run started with, written into its run directory (rank 0),
// which --resume reads back as its --config.
inline constexpr const char* kOptionsFile = "options.toml";
// Options options.toml leaves out: the file itself and the commands that read
// it (which would make the resumed run another run, or resume it again), and
// each rank's own settings.
bool kept_in_options_file(const std::string& long_name);
// argv with "--config RUN_DIR/options.toml" added after the program name when
// it holds "--resume RUN_DIR" (or "--search-doom RUN_DIR") and no --config.
std::vector<std::string> with_resume_config(const std::vector<std::string>& args);
// Writes RUN_DIR/options.toml: every option given (on the command line, in
// --config or the environment) as it was given, but --config, --resume and
// the rank's own settings; --resume reads it back.
void write_options_file(const CLI::App& app, const std::string& run_dir);

}  // namespace nanscope::trainer
