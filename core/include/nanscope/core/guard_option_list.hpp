#pragma once
// Every StepGuard option a user sets, declared once. nanscope-train's flags
// (--rollback-every), Python's StepGuard keywords (rollback_every=), the config
// a run.h5 records (rollback_every) and the check of a C++ GuardOptions
// (GuardOptions::rollback.every) are all made from this list: a new option is
// a field in GuardOptions (guard_options.hpp) and one entry here.
// No LibTorch: the command line parses with it beside the LibTorch batches.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nanscope/core/guard_options.hpp"

namespace nanscope {

// What an option holds, and so how each surface reads it.
enum class OptionKind {
  on_off,     // "on" or "off"; a Python bool
  word,       // one of a few words; a Python str
  integer,    // a whole number; a Python int
  number,     // a finite number; a Python float
  names,      // comma-separated module paths ("a.b,c"); a Python list of str
  directory,  // a path; a Python str or os.PathLike
};

// How a message or a help text spells an option: as nanscope-train's flag,
// as Python's keyword, or as the C++ field.
enum class OptionSpelling { flag, keyword, field };

struct GuardOption {
  std::string name;   // snake_case: the keyword and the config key
  std::string field;  // its path in GuardOptions ("rollback.every")
  OptionKind kind;
  std::vector<std::string> words;  // on_off, word: the words it accepts, as help lists them
  std::string section;             // the heading nanscope-train's --help lists it under
  // Help text; "{other_option}" is another option, spelled as the reader writes it.
  std::string help;
  // The value as text, as the config records it and --help shows a default.
  std::function<std::string(const GuardOptions&)> text;
  // Sets the value from text. A value the option refuses throws
  // std::invalid_argument("must be a positive whole number, not '0'"), which
  // the caller puts after the option's name.
  std::function<void(GuardOptions&, const std::string&)> set;
};

const std::vector<GuardOption>& guard_option_list();
// The option called `name` (snake_case), or nullptr.
const GuardOption* find_guard_option(const std::string& name);

// "--rollback-every", "rollback_every", "GuardOptions::rollback.every".
std::string spelled(const GuardOption& option, OptionSpelling spelling);
// The option's help with every "{name}" spelled.
std::string option_help(const GuardOption& option, OptionSpelling spelling);
// The spelling whoever runs a loop of `origin` writes (a flag, a keyword, a field).
OptionSpelling spelling_of(format::Origin origin);

// The config run.h5 and every snapshot record: the loop's own entries
// (GuardOptions::config) and every option's value by name.
std::map<std::string, std::string> recorded_config(const GuardOptions& options);

// Throws std::invalid_argument naming the option as `spelling` spells it when a
// value is one its text would be refused as (GuardOptions set field by field
// in C++), or when two options contradict each other (an activation record
// with the probe off).
void check_guard_options(const GuardOptions& options, OptionSpelling spelling);

}  // namespace nanscope
