#include "nanscope/trainer/options_cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/guard_option_list.hpp"

namespace nanscope::trainer {

namespace {

// CLI11's PositiveNumber and NonNegativeNumber accept NaN and word their
// refusal as a range up to 1.8e308; these say what is wrong in one line.
CLI::Validator number_at_least(double lowest, bool strictly, const char* name) {
  return CLI::Validator(
      [lowest, strictly, name](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok =
            end != text.c_str() && *end == '\0' && std::isfinite(v) && (strictly ? v > lowest : v >= lowest);
        return ok ? std::string() : "must be a " + std::string(name) + " number, not '" + text + "'";
      },
      strictly ? "POSITIVE" : "NONNEGATIVE");
}
const CLI::Validator kPositive = number_at_least(0, true, "positive");
const CLI::Validator kNonNegative = number_at_least(0, false, "non-negative finite");

// The words an option takes, in the order --help lists them.
template <typename T>
using Words = std::vector<std::pair<std::string, T>>;

// Every word of a vocabulary list (format/vocabulary.hpp's X-macros), in its order.
template <typename T>
Words<T> all_words() {
  Words<T> out;
  for (size_t i = 0; i < format::Words<T>::count; ++i)
    out.emplace_back(format::Words<T>::spellings[i], static_cast<T>(i));
  return out;
}

// A value as the run config records it.
std::string value_text(const std::string& v) { return v; }
std::string value_text(double v) { return number_text(v); }
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
std::string value_text(T v) {
  return std::to_string(v);
}

// A run config key: the long flag name, '_' for '-' (--batch-size: batch_size).
std::string config_key(const std::string& flag) {
  std::string key = flag.substr(flag.find_first_not_of('-'));
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

// nanscope-train's own options, each declared once, here: its flag, help and
// check for CLI11 (so options.toml and --resume, which CLI11 reads, follow),
// and how the run config records its value. A field is a member pointer of
// TrainOptions or a lambda reaching into it (both called with std::invoke).
class Declare {
 public:
  Declare(CLI::App& app, TrainOptions& o, RecordedOptions* recorded) : app_(app), o_(o), recorded_(recorded) {}

  template <typename Field>
  CLI::Option* option(const std::string& flag, Field field, const std::string& help) {
    record(flag, [field](const TrainOptions& o) { return value_text(std::invoke(field, o)); });
    return app_.add_option(flag, std::invoke(field, o_), help);
  }

  // An option that takes one of a few words. --help shows them and the default
  // as a word (--optimizer adamw|sgd=adamw): CLI11's own description of a
  // mapping prints the values the words map to, which for an enum are raw bytes.
  template <typename Field, typename T>
  CLI::Option* words(const std::string& flag, Field field, const Words<T>& words, const std::string& help) {
    record(flag, [field, words](const TrainOptions& o) {
      for (const auto& [word, v] : words)
        if (v == std::invoke(field, o)) return word;
      return std::string();
    });
    T& value = std::invoke(field, o_);
    std::string names, current;
    for (const auto& [word, v] : words) {
      names += (names.empty() ? "" : "|") + word;
      if (v == value && current.empty()) current = word;
    }
    CLI::Validator words_only = CLI::CheckedTransformer(words, CLI::ignore_case);
    words_only.description("");
    return app_.add_option(flag, value, help)->transform(words_only)->type_name(names)->default_str(current);
  }

  // A flag that sets its field to `sets`; recorded as whether it is in force.
  template <typename Field>
  CLI::Option* flag(const std::string& flag, Field field, bool sets, const std::string& help) {
    record(flag, [field, sets](const TrainOptions& o) { return std::invoke(field, o) == sets ? "true" : "false"; });
    return app_.add_flag(flag + (sets ? "" : "{false}"), std::invoke(field, o_), help);
  }

  // An option read by its own function (CLI11 binds no field), and how the
  // run config records it, under `key`.
  CLI::Option* by_function(const std::string& flag, const std::function<void(const std::vector<std::string>&)>& read,
                           const std::string& key, std::function<std::string(const TrainOptions&)> text,
                           const std::string& help) {
    if (recorded_) recorded_->push_back({key, std::move(text)});
    return app_.add_option_function<std::vector<std::string>>(flag, read, help);
  }

 private:
  void record(const std::string& flag, std::function<std::string(const TrainOptions&)> text) {
    if (recorded_ && recorded_in_run_config(config_key(flag)))
      recorded_->push_back({config_key(flag), std::move(text)});
  }
  CLI::App& app_;
  TrainOptions& o_;
  RecordedOptions* recorded_;
};

// The guard's options, one flag each from their one declaration
// (core/guard_option_list.hpp): --help, the check of a value and what the
// flag sets all come from it. The guard records them in the run config itself.
void add_guard_flags(CLI::App& app, GuardOptions& o) {
  for (const GuardOption& option : guard_option_list()) {
    const auto refusal = [&option](std::string& text) {
      GuardOptions scratch;
      try {
        option.set(scratch, text);
        return std::string();
      } catch (const std::invalid_argument& e) {
        return std::string(e.what());
      }
    };
    std::string type = option.kind == OptionKind::integer  ? "INT"
                       : option.kind == OptionKind::number ? "FLOAT"
                       : option.kind == OptionKind::names  ? "A.B,C"
                                                           : "DIR";
    if (!option.words.empty()) {
      type.clear();
      for (const auto& word : option.words) type += (type.empty() ? "" : "|") + word;
    }
    CLI::Option* flag = app.add_option_function<std::string>(
        spelled(option, OptionSpelling::flag), [&o, &option](const std::string& text) { option.set(o, text); },
        option_help(option, OptionSpelling::flag));
    flag->check(CLI::Validator(refusal, ""))->type_name(type)->default_str(option.text(o));
    if (!option.section.empty()) flag->group(option.section);
  }
}

// This rank's planted faults as the run records them: KIND@STEP:ARG, comma-separated.
std::string faults_text(const TrainOptions& o) {
  std::string text;
  for (const Fault& f : faults_on_rank(o.faults, o.dist.rank))
    text += (text.empty() ? "" : ",") + std::string(fault_name(f.kind)) + "@" + std::to_string(f.step) + ":" +
            number_text(f.arg);
  return text;
}

// What the program does, its exit codes, and --config.
void describe_train(CLI::App& app) {
  app.description(
      "Fine-tunes a model with the stock mixed-precision fallback loop: autocast, dynamic loss\n"
      "scaling, clipping after unscale, skip-the-batch on a non-finite step and a one-shot\n"
      "fallback to fp32 with an LR backoff. Writes RUN_DIR/run.h5 (docs/format.md).\n"
      "Early warnings (--warn) name a signal heading for a NaN before it gets there; rollback\n"
      "(--rollback) goes back to a saved good state when skipping cannot save the run.\n"
      "Exit codes: 0 done, 1 training failed, 2 bad arguments or input, 3 another rank died or\n"
      "a collective timed out (multi-process runs), 4 the run is dead and stopped: its weights\n"
      "went non-finite with no rollback left, or trouble outlasted every rollback and the fp32\n"
      "fallback, 130 interrupted (Ctrl-C).");
  app.set_config("--config", "", "Read options from a TOML or INI file (keys are the long flag names)");
  app.allow_config_extras(CLI::config_extras_mode::error);  // a misspelt key is an error, not ignored
}

// The model, its data and the optimisation (the guard's flags follow these).
void declare_training(Declare& declare) {
  declare
      .option("--model", &TrainOptions::model,
              "Model: 'mlp', 'gpt' (built-in) or PATH.pt, a TorchScript file whose "
              "forward(inputs, targets) returns a scalar loss")
      ->capture_default_str();
  declare.option("--data", &TrainOptions::data,
                 "HDF5 file with /inputs and /targets (first dimension = samples). Default: "
                 "built-in data (gpt: a text every Debian system has; mlp: a seeded teacher task)");
  declare.option("--init", &TrainOptions::init, "Checkpoint to start from (fine-tuning)");
  declare.option("--steps", &TrainOptions::steps, "Number of optimizer steps")->capture_default_str()->check(kPositive);
  declare.option("--batch-size", &TrainOptions::batch_size, "Samples per batch")
      ->capture_default_str()
      ->check(kPositive);
  declare.option("--lr", &TrainOptions::lr, "Peak learning rate")->capture_default_str()->check(kPositive);
  declare.words("--optimizer", &TrainOptions::optimizer, all_words<OptimizerKind>(), "adamw, or sgd (momentum 0.9)");
  declare.option("--weight-decay", &TrainOptions::weight_decay, "Weight decay")
      ->capture_default_str()
      ->check(kNonNegative);
  declare.words("--schedule", &TrainOptions::schedule, all_words<Schedule>(),
                "LR schedule: constant, or cosine decay after warmup");
  declare.words("--schedule-on-skip", &TrainOptions::schedule_holds_on_skip,
                Words<bool>{{"advance", false}, {"hold", true}},
                "What a skipped step does to the LR schedule (warmup, cosine): advance (the schedule follows "
                "the step number, as a loop that calls scheduler.step() every iteration does) or hold (it "
                "follows the updates that reached the weights, so a run with skips gets its whole warmup)");
  declare.option("--warmup", &TrainOptions::warmup, "Linear warmup steps (P12)")
      ->capture_default_str()
      ->check(kNonNegative);
}

// The loss and the data order.
void declare_loss_and_order(Declare& declare) {
  declare.option("--z-loss", &TrainOptions::z_loss, "z-loss coefficient (P15; 1e-4 is the usual value); 0: off")
      ->capture_default_str()
      ->check(kNonNegative);
  declare.flag("--no-shuffle", &TrainOptions::shuffle, false,
               "Batch i is rows [i*B, (i+1)*B) wrapping around, instead of a seeded shuffle");
}

void declare_checkpoints(Declare& declare) {
  declare.option("--save", &TrainOptions::save,
                 "Write a checkpoint here at the end (several ranks: rank 0 only, unless PATH holds {rank}); "
                 "default with --checkpoint-every: RUN_DIR/checkpoint.h5 (checkpoint-rank-{rank}.h5)");
  declare
      .option("--checkpoint-every", &TrainOptions::checkpoint_every,
              "Also write the --save checkpoint every N steps (0: only at the end); these can resume the run")
      ->check(kNonNegative);
  declare
      .option("--keep-checkpoints", &TrainOptions::keep_checkpoints,
              "Also keep the newest N periodic checkpoints by step (PATH.step-NNNNNNN.h5, hard links), so "
              "--search-doom can replay from one before the step that doomed the run (0: only the newest "
              "and the one before it)")
      ->capture_default_str()
      ->check(kNonNegative);
  declare
      .option("--resume", &TrainOptions::resume,
              "Continue the run in RUN_DIR from its newest checkpoint (--checkpoint-every): the options it "
              "was started with (RUN_DIR/options.toml; flags given here override them), the same data "
              "order, RNG, loss scale and schedule; run.h5 drops the rows after the checkpoint and goes on. "
              "Also clears the mark a killed writer leaves, so plain HDF5 readers open run.h5 again")
      ->type_name("RUN_DIR");
}

// --search-doom and its options: a run that trains nothing.
void declare_doom_search(Declare& declare) {
  const std::string after = "After a run: the step that doomed it";
  declare
      .option("--search-doom", &TrainOptions::search_doom,
              "Train nothing: find the earlier step whose update doomed RUN_DIR's failing step, replaying "
              "from the newest checkpoint before it (--checkpoint-every) with the run's options "
              "(RUN_DIR/options.toml), data order, LR, precision and loss scale; a bisection over "
              "updates left out, then the dooming step's rows (docs/recovery.md). Writes nothing into RUN_DIR")
      ->type_name("RUN_DIR")
      ->group(after);
  declare
      .option("--failing-step", &TrainOptions::failing_step,
              "--search-doom: the step to explain (default: the run's first non-finite step)")
      ->check(kNonNegative)
      ->group(after);
  declare
      .option("--doom-budget", &TrainOptions::doom_budget,
              "--search-doom: steps the search may replay in all (the first replay, of the run as it was, "
              "included); when spent, it names the steps still suspected")
      ->capture_default_str()
      ->check(kPositive)
      ->group(after);
  declare
      .flag("--json", &TrainOptions::doom_json, true,
            "--search-doom: print the finding as one JSON object (outcome, failing_step, step, rows, first, "
            "last, replays, steps_run, text), as Python's DoomReport.to_json(), instead of the sentence")
      ->group(after);
}

// Seed, threads, device and the planted faults.
void declare_run(Declare& declare, TrainOptions& o) {
  declare.option("--seed", &TrainOptions::seed, "Seed for initialisation, shuffling and dropout")
      ->capture_default_str();
  declare
      .option("--threads", &TrainOptions::threads,
              "Intra-op threads (0: LibTorch's default; with several ranks, the cores shared between the ranks on "
              "this machine). OpenBLAS runs on one thread unless OPENBLAS_NUM_THREADS is set")
      ->check(kNonNegative);
  declare.words("--device", &TrainOptions::device, all_words<DeviceChoice>(),
                "auto (CUDA when there is one), cpu or cuda");
  declare.flag("--tf32", &TrainOptions::tf32, true, "CUDA: allow TF32 matmuls and convolutions (P2)");
  declare.flag("--deterministic", &TrainOptions::deterministic, true, "Use deterministic algorithms only (P19)");
  declare
      .by_function(
          "--fault",
          [&o](const std::vector<std::string>& specs) {
            for (const auto& s : specs) o.faults.push_back(parse_fault(s));
          },
          "faults", faults_text,
          "Plant a fault: KIND@STEP[:ARG][/rankR] with KIND one of nonfinite_input (ARG: sample row), "
          "log_nonpositive, sqrt_grad_zero, zero_variance_norm, exp_overflow, lr_spike "
          "(ARG: factor, default 1000, from STEP on), lr_pulse (the same at STEP alone), and the slow-onset lr_ramp "
          "and input_ramp (the LR or the float inputs times (1+ARG)^(steps since STEP); defaults 0.2, 0.3), and "
          "sample_burst (float inputs and targets times ARG, default 1e4, for 8 steps), buffer_nan (NaN written into "
          "the model's first buffer after STEP), corrupt_sample (data set row ARG reads as NaN from STEP on, every "
          "epoch); /rankR plants it on rank R "
          "only. Repeatable. See samples/faults/")
      ->type_name("KIND@STEP[:ARG][/rankR]");
}

void declare_model_sizes(Declare& declare) {
  const std::string sizes = "Built-in model sizes";
  declare.option("--n-layer", &TrainOptions::n_layer, "gpt: transformer blocks")->capture_default_str()->group(sizes);
  declare.option("--n-head", &TrainOptions::n_head, "gpt: attention heads")->capture_default_str()->group(sizes);
  declare.option("--n-embd", &TrainOptions::n_embd, "gpt: embedding width")->capture_default_str()->group(sizes);
  declare.option("--seq-len", &TrainOptions::seq_len, "gpt: tokens per sample")->capture_default_str()->group(sizes);
  declare.option("--hidden", &TrainOptions::hidden, "mlp: hidden width")->capture_default_str()->group(sizes);
}

void declare_data_parallel(CLI::App& app, Declare& declare) {
  // Plain options under a help heading, not an option group: CLI11 2.4 reads
  // an option group's environment variables only when one of its flags is given.
  const std::string dist = "Data parallel (c10d): run N copies, one per rank, as torchrun does";
  app.footer(
      "Data parallel: each rank reads its shard of every global batch (--batch-size is per rank), "
      "gradients are averaged with a bucketed all-reduce, and all ranks skip, back off and fall "
      "back together. Rank R writes RUN_DIR/run-rank-R.h5 and RUN_DIR/snapshots/rank-R/. Flags "
      "override the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).");
  const auto in_dist = [](auto member) {
    return [member](auto& o) -> auto& { return o.dist.*member; };
  };
  declare.option("--rank", in_dist(&DistOptions::rank), "This process's rank")
      ->envname("RANK")
      ->capture_default_str()
      ->group(dist);
  declare.option("--world-size", in_dist(&DistOptions::world_size), "Number of processes")
      ->envname("WORLD_SIZE")
      ->capture_default_str()
      ->group(dist);
  declare.option("--local-rank", in_dist(&DistOptions::local_rank), "Rank on this machine (picks the CUDA device)")
      ->envname("LOCAL_RANK")
      ->capture_default_str()
      ->group(dist);
  declare.option("--master-addr", in_dist(&DistOptions::master_addr), "Rank 0's address (its TCPStore)")
      ->envname("MASTER_ADDR")
      ->capture_default_str()
      ->group(dist);
  declare.option("--master-port", in_dist(&DistOptions::master_port), "Rank 0's TCPStore port")
      ->envname("MASTER_PORT")
      ->capture_default_str()
      ->group(dist);
  declare
      .words("--dist-backend", in_dist(&DistOptions::backend), all_words<DistBackend>(),
             "auto (nccl for CUDA where built, else gloo), gloo or nccl")
      ->group(dist);
  declare
      .option("--dist-timeout", in_dist(&DistOptions::timeout_s),
              "Seconds a rendezvous or collective may wait for the other ranks before the run "
              "ends with an error (exit 3)")
      ->capture_default_str()
      ->check(kPositive)
      ->group(dist);
  declare.option("--bucket-mb", in_dist(&DistOptions::bucket_mb), "Gradient all-reduce bucket size in MiB")
      ->capture_default_str()
      ->check(kPositive)
      ->group(dist);
}

// Declares every option on `app`, bound to `o`, in the order --help lists
// them; with `recorded`, also lists how the run config records each.
void declare_train_options(CLI::App& app, TrainOptions& o, RecordedOptions* recorded) {
  Declare declare(app, o, recorded);
  describe_train(app);
  declare_training(declare);
  add_guard_flags(app, o);
  declare_loss_and_order(declare);
  declare_checkpoints(declare);
  declare_doom_search(declare);
  declare_run(declare, o);
  declare_model_sizes(declare);
  declare_data_parallel(app, declare);
  declare.option("--log-every", &TrainOptions::log_every, "Progress line every N steps (0: about once a second)");
  declare.flag("--quiet", &TrainOptions::quiet, true, "No progress line, only the summary");
}

}  // namespace

void add_train_options(CLI::App& app, TrainOptions& o) { declare_train_options(app, o, nullptr); }

std::map<std::string, std::string> recorded_options(const TrainOptions& o) {
  // The declaration is made on a scratch app for its list; the values are o's.
  CLI::App scratch;
  TrainOptions unused;
  RecordedOptions recorded;
  declare_train_options(scratch, unused, &recorded);
  std::map<std::string, std::string> config;
  for (const RecordedOption& r : recorded) config[r.key] = r.text(o);
  return config;
}

void apply_defaults(TrainOptions& o) {
  if (!o.resume.empty()) o.run_dir = o.resume;
  if (!o.search_doom.empty()) o.run_dir = o.search_doom;
  if (o.checkpoint_every > 0 && o.save.empty())
    o.save =
        (std::filesystem::path(o.run_dir) / (o.dist.world_size > 1 ? "checkpoint-rank-{rank}.h5" : "checkpoint.h5"))
            .string();
}

bool recorded_in_run_config(const std::string& key) {
  // How this process was asked to run, not what the run is.
  static const std::set<std::string> kLeftOut{"help",         "config",      "resume", "search_doom",
                                              "failing_step", "doom_budget", "json"};
  return kLeftOut.count(key) == 0;
}

void validate_options(const TrainOptions& o) {
  check_guard_options(o, OptionSpelling::flag);
  if (o.warmup >= o.steps && o.schedule == Schedule::cosine)
    throw std::invalid_argument("--warmup must be shorter than --steps for the cosine schedule");
  if (o.keep_checkpoints > 0 && o.checkpoint_every == 0)
    throw std::invalid_argument("--keep-checkpoints needs --checkpoint-every N");
  if (o.doom_json && o.search_doom.empty())
    throw std::invalid_argument("--json prints the finding of --search-doom RUN_DIR; a training run writes run.h5");
  if (!o.search_doom.empty() && !o.resume.empty())
    throw std::invalid_argument("--search-doom and --resume: one at a time (the search trains nothing)");
  validate(o.dist);
  for (const auto& f : o.faults)
    if (f.rank >= o.dist.world_size)
      throw std::invalid_argument(std::string("--fault ") + fault_name(f.kind) + "@" + std::to_string(f.step) +
                                  "/rank" + std::to_string(f.rank) + ": there are only " +
                                  std::to_string(o.dist.world_size) + " rank(s)");
  for (const auto& f : o.faults)
    if (f.step >= o.steps)
      throw std::invalid_argument(std::string("--fault ") + fault_name(f.kind) + "@" + std::to_string(f.step) +
                                  " is past the last step " + std::to_string(o.steps - 1));
}

}  // namespace nanscope::trainer
