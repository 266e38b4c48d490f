#include "nanscope/core/guard_option_list.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "nanscope/common/number_text.hpp"

namespace nanscope {

namespace {

// A field's path as text and a reference to it in a GuardOptions (const or not).
#define NANSCOPE_FIELD(path) \
#path, [](auto& o) -> auto& { return o.path; }

std::string refused(const std::string& what, const std::string& text) {
  return "must be " + what + ", not '" + text + "'";
}

bool same_word(const std::string& a, const std::string& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

// Numbers as text without the C locale (a Python program may have set a
// comma-decimal one): the whole text, an optional leading '+'.
template <typename Number>  // int64_t or double
bool parse_all(const std::string& text, Number& value) {
  const char* first = text.c_str() + (!text.empty() && text[0] == '+');
  const char* last = text.c_str() + text.size();
  const auto [end, error] = std::from_chars(first, last, value);
  return first != last && error == std::errc() && end == last;
}
// The shortest text that reads back as the same double ("0.5", "1e-05").
std::string exact_text(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : number_text(value);
}

// The words a value may be given as; a value's first spelling is the one
// written back and listed in help, later ones are accepted quietly ("on" for
// --fallback whole, Python's str(torch.bfloat16) for bf16, and the numbers
// nanscope-train before 1.4's option list wrote into options.toml for a word
// option, which --resume reads back).
template <typename T>
using Spellings = std::vector<std::pair<const char*, T>>;

template <typename T, typename Field>
GuardOption word_option(const char* name, const char* field, Field field_of, OptionKind kind, Spellings<T> spellings,
                        const char* section, const char* help) {
  std::vector<std::string> listed;
  for (size_t i = 0; i < spellings.size(); ++i)
    if (std::none_of(spellings.begin(), spellings.begin() + i,
                     [&](const auto& earlier) { return earlier.second == spellings[i].second; }))
      listed.emplace_back(spellings[i].first);
  std::string choices;
  for (const auto& w : listed) choices += (choices.empty() ? "" : ", ") + w;
  auto text = [field_of, spellings](const GuardOptions& o) {
    for (const auto& [word, value] : spellings)
      if (value == field_of(o)) return std::string(word);
    return std::string("?");
  };
  auto set = [field_of, spellings, choices](GuardOptions& o, const std::string& given) {
    for (const auto& [word, value] : spellings)
      if (same_word(word, given)) {
        field_of(o) = value;
        return;
      }
    throw std::invalid_argument(refused("one of " + choices, given));
  };
  return {name, field, kind, std::move(listed), section, help, std::move(text), std::move(set)};
}

template <typename Field>
GuardOption on_off(const char* name, const char* field, Field field_of, const char* section, const char* help) {
  return word_option(
      name, field, field_of, OptionKind::on_off,
      Spellings<bool>{{"on", true}, {"off", false}, {"true", true}, {"false", false}, {"1", true}, {"0", false}},
      section, help);
}

// The lowest value a number may take, and whether it is excluded.
struct AtLeast {
  double lowest;
  bool excluded;
  const char* words;  // "a positive", "a non-negative"
};
constexpr AtLeast kPositive{0, true, "a positive"};
constexpr AtLeast kNonNegative{0, false, "a non-negative"};

bool within(double v, AtLeast bound) { return bound.excluded ? v > bound.lowest : v >= bound.lowest; }

template <typename Field>
GuardOption integer(const char* name, const char* field, Field field_of, AtLeast bound, const char* section,
                    const char* help) {
  auto text = [field_of](const GuardOptions& o) { return std::to_string(field_of(o)); };
  auto set = [field_of, bound](GuardOptions& o, const std::string& given) {
    int64_t v = 0;
    if (!parse_all(given, v) || !within(double(v), bound))
      throw std::invalid_argument(refused(std::string(bound.words) + " whole number", given));
    field_of(o) = v;
  };
  return {name, field, OptionKind::integer, {}, section, help, std::move(text), std::move(set)};
}

// `highest` (included) bounds it above too.
template <typename Field>
GuardOption number(const char* name, const char* field, Field field_of, AtLeast bound, double highest,
                   const char* section, const char* help) {
  auto text = [field_of](const GuardOptions& o) { return exact_text(field_of(o)); };
  auto set = [field_of, bound, highest](GuardOptions& o, const std::string& given) {
    double v = 0;
    if (!parse_all(given, v) || !std::isfinite(v) || !within(v, bound) || v > highest) {
      const std::string what = std::isinf(highest) ? std::string(bound.words) + " finite number"
                                                   : "a number in " + std::string(bound.excluded ? "(" : "[") +
                                                         number_text(bound.lowest) + ", " + number_text(highest) + "]";
      throw std::invalid_argument(refused(what, given));
    }
    field_of(o) = v;
  };
  return {name, field, OptionKind::number, {}, section, help, std::move(text), std::move(set)};
}
constexpr double kUnbounded = INFINITY;

const char* const kPrecision = "The guard: precision and fallback";
const char* const kForensics = "The guard: forensics and warnings";
const char* const kRollback = "The guard: rollback (docs/sentinel.md) and the dooming step (docs/recovery.md)";

// The options of the run and its precision.
void declare_precision_options(std::vector<GuardOption>& list) {
  list.push_back({"run_dir",
                  "run_dir",
                  OptionKind::directory,
                  {},
                  "",
                  "Directory for run.h5 and snapshots/ (created)",
                  [](const GuardOptions& o) { return o.run_dir; },
                  [](GuardOptions& o, const std::string& given) {
                    if (given.empty()) throw std::invalid_argument("must not be empty");
                    o.run_dir = given;
                  }});
  list.push_back(word_option("amp", NANSCOPE_FIELD(amp), OptionKind::word,
                             Spellings<Amp>{{"off", Amp::fp32},
                                            {"bf16", Amp::bf16},
                                            {"fp16", Amp::fp16},
                                            {"fp32", Amp::fp32},
                                            {"torch.bfloat16", Amp::bf16},
                                            {"torch.float16", Amp::fp16},
                                            {"torch.float32", Amp::fp32},
                                            {"0", Amp::fp32},
                                            {"1", Amp::bf16},
                                            {"2", Amp::fp16}},
                             kPrecision,
                             "Autocast precision to start in: off (fp32), bf16, or fp16 (with the loss scaler)"));
  list.push_back(number("clip", NANSCOPE_FIELD(clip), kNonNegative, kUnbounded, kPrecision,
                        "Clip the global grad norm to this after unscaling; 0: off"));
  list.push_back(word_option(
      "fallback", NANSCOPE_FIELD(fallback), OptionKind::word,
      Spellings<FallbackMode>{{"whole", FallbackMode::whole},
                              {"auto", FallbackMode::automatic},
                              {"off", FallbackMode::off},
                              {"on", FallbackMode::whole},
                              {"0", FallbackMode::off},
                              {"1", FallbackMode::whole},
                              {"2", FallbackMode::automatic}},
      kPrecision,
      "What a non-finite step triggers besides the skip. whole: the stock one-shot fallback (the whole model "
      "to fp32 for the rest of the run, LR x {lr_backoff}). auto: the remedy the step's diagnosis supports: a "
      "non-finite input or a batch the data is to blame for, or a step that is finite when re-run: skip only; "
      "finite with autocast off: the smallest set of modules that makes it finite goes to fp32, the rest stays "
      "low precision, no LR cut; otherwise the whole fallback (docs/recovery.md). off: skip only"));
  list.push_back(number("lr_backoff", NANSCOPE_FIELD(lr_backoff), AtLeast{0, true, ""}, 1.0, kPrecision,
                        "LR multiplier applied once by the whole-model fp32 fallback and by each rollback"));
  list.push_back({"fp32_modules",
                  "fp32_modules",
                  OptionKind::names,
                  {},
                  kPrecision,
                  "Modules that run with autocast off from the first step, dotted paths as named_modules() names "
                  "them (the replay prints the set for a snapshot); the rest keeps {amp}",
                  [](const GuardOptions& o) { return fp32_modules_flag_value(o.fp32_modules); },
                  [](GuardOptions& o, const std::string& given) { o.fp32_modules = parse_fp32_modules(given); }});
  list.push_back(number("fallback_min_scale", NANSCOPE_FIELD(fallback_min_scale), kNonNegative, kUnbounded, kPrecision,
                        "fp16: overflowing gradients are the scaler's business (skip and back off) until the "
                        "scale falls below this; then the fallback fires"));
}

// The options of forensics and warnings.
void declare_forensics_options(std::vector<GuardOption>& list) {
  list.push_back(on_off("probe", NANSCOPE_FIELD(probe), kForensics,
                        "on: per-layer grad norms and the forensic re-run of a non-finite step; off: the bare loop"));
  list.push_back(on_off("warn", NANSCOPE_FIELD(warn), kForensics,
                        "on: early warnings (grad-norm spikes and growth, per-layer spikes, loss spikes, the fp16 "
                        "loss scale collapsing, activations nearing the precision's limit) as run.h5 events and "
                        "log lines, from values each step already has"));
  list.push_back(word_option("capture", NANSCOPE_FIELD(capture_every_step), OptionKind::word,
                             Spellings<bool>{{"on-failure", false}, {"every-step", true}, {"0", false}, {"1", true}},
                             kForensics,
                             "When op-level capture runs: on-failure (the forensic re-run of a non-finite step) or "
                             "every-step (every op of every step; slow, for hunting and measuring)"));
  list.push_back(integer("act_absmax_every", NANSCOPE_FIELD(act_absmax_every), kNonNegative, kForensics,
                         "Record each layer's activation abs-max every N steps into run.h5 (0: never); the "
                         "headroom to fp16/bf16 is log2(limit / absmax)"));
  list.push_back(integer("max_snapshots", NANSCOPE_FIELD(max_snapshots), kNonNegative, kForensics,
                         "Snapshots a run writes at most: one for each non-finite step whose first birth (kind, "
                         "op, module) is new; the others are counted in snapshot_skipped events"));
  list.push_back(integer("max_nonfinite_run", NANSCOPE_FIELD(max_nonfinite_run), kNonNegative, kForensics,
                         "A dead run stops (DeadRunError; nanscope-train exits 4) after this many non-finite steps "
                         "in a row once nothing is left to try: the fp32 fallback done (or off) and no rollback "
                         "left (or {rollback} off). Weights that are finite but wrecked would otherwise be skipped "
                         "to the end; 0: never"));
}

// The options of rollback and the doom search.
void declare_rollback_options(std::vector<GuardOption>& list) {
  list.push_back(on_off("rollback", NANSCOPE_FIELD(rollback.enabled), kRollback,
                        "on: keep the last few good states in memory and go back to the newest one from before the "
                        "trouble when the weights went non-finite or a loss spike or non-finite step comes back on "
                        "the next step; the rolled-back steps' batches are skipped and the LR is multiplied by "
                        "{lr_backoff}. off: the stock loop (skip; a run with non-finite weights stops)"));
  list.push_back(integer("rollback_every", NANSCOPE_FIELD(rollback.every), kPositive, kRollback,
                         "Save a state after every N healthy steps"));
  list.push_back(integer("rollback_states", NANSCOPE_FIELD(rollback.states), kPositive, kRollback,
                         "States kept (the oldest goes first)"));
  list.push_back(number("rollback_memory", NANSCOPE_FIELD(rollback.memory_mb), kPositive, kUnbounded, kRollback,
                        "Host memory the saved states may take, in MB (a state: weights, buffers, optimizer state)"));
  list.push_back(integer("max_rollbacks", NANSCOPE_FIELD(rollback.max_rollbacks), kNonNegative, kRollback,
                         "Rollbacks per run; then the fp32 fallback, then stop"));
  list.push_back(on_off("doom_search", NANSCOPE_FIELD(doom_search.enabled), kRollback,
                        "on: at the first of a run of non-finite steps, replay the steps since the oldest saved "
                        "state leaving updates out (a bisection) to find the earlier step, and its batch rows, "
                        "whose update doomed it (a `doom` event); with {rollback} on, go back and replay the run "
                        "without that update only, instead of skipping every batch since"));
  list.push_back(number("doom_search_memory", NANSCOPE_FIELD(doom_search.memory_mb), kPositive, kUnbounded, kRollback,
                        "Host memory the steps kept for the search may take, in MB (references to the batches)"));
}

std::vector<GuardOption> declared_options() {
  std::vector<GuardOption> list;
  declare_precision_options(list);
  declare_forensics_options(list);
  declare_rollback_options(list);
  return list;
}

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

}  // namespace

const std::vector<GuardOption>& guard_option_list() {
  static const std::vector<GuardOption> list = declared_options();
  return list;
}

const GuardOption* find_guard_option(const std::string& name) {
  for (const GuardOption& option : guard_option_list())
    if (option.name == name) return &option;
  return nullptr;
}

std::string spelled(const GuardOption& option, OptionSpelling spelling) {
  switch (spelling) {
    case OptionSpelling::flag: return "--" + dashed(option.name);
    case OptionSpelling::keyword: return option.name;
    case OptionSpelling::field: return "GuardOptions::" + option.field;
  }
  return option.name;
}

std::string option_help(const GuardOption& option, OptionSpelling spelling) {
  std::string out;
  for (size_t at = 0; at < option.help.size();) {
    const size_t open = option.help.find('{', at);
    const size_t close = open == std::string::npos ? open : option.help.find('}', open);
    if (close == std::string::npos) {
      out += option.help.substr(at);
      break;
    }
    const GuardOption* named = find_guard_option(option.help.substr(open + 1, close - open - 1));
    out += option.help.substr(at, open - at);
    out += named ? spelled(*named, spelling) : option.help.substr(open, close - open + 1);
    at = close + 1;
  }
  return out;
}

OptionSpelling spelling_of(format::Origin origin) {
  switch (origin) {
    case format::Origin::python: return OptionSpelling::keyword;
    case format::Origin::cpp: return OptionSpelling::field;
    case format::Origin::nanscope_train: return OptionSpelling::flag;
    case format::Origin::unknown: return OptionSpelling::flag;  // a file from before origins: nanscope-train's
  }
  return OptionSpelling::flag;
}

std::map<std::string, std::string> recorded_config(const GuardOptions& options) {
  std::map<std::string, std::string> config = options.config;
  for (const GuardOption& option : guard_option_list()) config[option.name] = option.text(options);
  return config;
}

void check_guard_options(const GuardOptions& options, OptionSpelling spelling) {
  for (const GuardOption& option : guard_option_list()) {
    GuardOptions scratch;
    try {
      option.set(scratch, option.text(options));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(spelled(option, spelling) + ": " + e.what());
    }
  }
  auto needs_probe = [&](const char* name) {
    return spelled(*find_guard_option(name), spelling) + " needs " + spelled(*find_guard_option("probe"), spelling) +
           " on";
  };
  if (options.act_absmax_every > 0 && !options.probe) throw std::invalid_argument(needs_probe("act_absmax_every"));
  if (options.capture_every_step && !options.probe) throw std::invalid_argument(needs_probe("capture"));
}

}  // namespace nanscope
