#include "nanscope/trainer/options_cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

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

// An option that takes one of a few words. --help shows them and the default
// as a word (--amp off|bf16|fp16=off): CLI11's own description of a mapping
// prints the values the words map to, which for an enum are raw bytes.
template <typename T>
CLI::Option* add_word_option(CLI::App& app, const std::string& flag, T& value, const Words<T>& words,
                             const std::string& help) {
  std::string names, current;
  for (const auto& [word, v] : words) {
    names += (names.empty() ? "" : "|") + word;
    if (v == value && current.empty()) current = word;
  }
  CLI::Validator words_only = CLI::CheckedTransformer(words, CLI::ignore_case);
  words_only.description("");
  return app.add_option(flag, value, help)->transform(words_only)->type_name(names)->default_str(current);
}

// Every word of a vocabulary list (format/vocabulary.hpp's X-macros), in its order.
template <typename T>
Words<T> all_words() {
  Words<T> out;
  for (size_t i = 0; i < format::Words<T>::count; ++i)
    out.emplace_back(format::Words<T>::spellings[i], static_cast<T>(i));
  return out;
}

// The guard's options, one flag each from their one declaration
// (core/guard_option_list.hpp): --help, the check of a value and what the
// flag sets all come from it.
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

}  // namespace

void add_train_options(CLI::App& app, TrainOptions& o) {
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

  auto* model = app.add_option("--model", o.model,
                               "Model: 'mlp', 'gpt' (built-in) or PATH.pt, a TorchScript file whose "
                               "forward(inputs, targets) returns a scalar loss");
  model->capture_default_str();
  app.add_option("--data", o.data,
                 "HDF5 file with /inputs and /targets (first dimension = samples). Default: "
                 "built-in data (gpt: a text every Debian system has; mlp: a seeded teacher task)");
  app.add_option("--init", o.init, "Checkpoint to start from (fine-tuning)");
  app.add_option("--steps", o.steps, "Number of optimizer steps")->capture_default_str()->check(kPositive);
  app.add_option("--batch-size", o.batch_size, "Samples per batch")->capture_default_str()->check(kPositive);
  app.add_option("--lr", o.lr, "Peak learning rate")->capture_default_str()->check(kPositive);
  add_word_option(app, "--optimizer", o.optimizer, all_words<OptimizerKind>(), "adamw, or sgd (momentum 0.9)");
  app.add_option("--weight-decay", o.weight_decay, "Weight decay")->capture_default_str()->check(kNonNegative);
  add_word_option(app, "--schedule", o.schedule, all_words<Schedule>(),
                  "LR schedule: constant, or cosine decay after warmup");
  add_word_option(app, "--schedule-on-skip", o.schedule_holds_on_skip, Words<bool>{{"advance", false}, {"hold", true}},
                  "What a skipped step does to the LR schedule (warmup, cosine): advance (the schedule follows "
                  "the step number, as a loop that calls scheduler.step() every iteration does) or hold (it "
                  "follows the updates that reached the weights, so a run with skips gets its whole warmup)");
  app.add_option("--warmup", o.warmup, "Linear warmup steps (P12)")->capture_default_str()->check(kNonNegative);
  add_guard_flags(app, o);
  app.add_option("--z-loss", o.z_loss, "z-loss coefficient (P15; 1e-4 is the usual value); 0: off")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_flag("--no-shuffle{false}", o.shuffle,
               "Batch i is rows [i*B, (i+1)*B) wrapping around, instead of a seeded shuffle");
  app.add_option("--save", o.save,
                 "Write a checkpoint here at the end (several ranks: rank 0 only, unless PATH holds {rank}); "
                 "default with --checkpoint-every: RUN_DIR/checkpoint.h5 (checkpoint-rank-{rank}.h5)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Also write the --save checkpoint every N steps (0: only at the end); these can resume the run")
      ->check(kNonNegative);
  app.add_option("--keep-checkpoints", o.keep_checkpoints,
                 "Also keep the newest N periodic checkpoints by step (PATH.step-NNNNNNN.h5, hard links), so "
                 "--search-doom can replay from one before the step that doomed the run (0: only the newest "
                 "and the one before it)")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--resume", o.resume,
                 "Continue the run in RUN_DIR from its newest checkpoint (--checkpoint-every): the options it "
                 "was started with (RUN_DIR/options.toml; flags given here override them), the same data "
                 "order, RNG, loss scale and schedule; run.h5 drops the rows after the checkpoint and goes on. "
                 "Also clears the mark a killed writer leaves, so plain HDF5 readers open run.h5 again")
      ->type_name("RUN_DIR");
  const std::string after = "After a run: the step that doomed it";
  app.add_option("--search-doom", o.search_doom,
                 "Train nothing: find the earlier step whose update doomed RUN_DIR's failing step, replaying "
                 "from the newest checkpoint before it (--checkpoint-every) with the run's options "
                 "(RUN_DIR/options.toml), data order, LR, precision and loss scale; a bisection over "
                 "updates left out, then the dooming step's rows (docs/recovery.md). Writes nothing into RUN_DIR")
      ->type_name("RUN_DIR")
      ->group(after);
  app.add_option("--failing-step", o.failing_step,
                 "--search-doom: the step to explain (default: the run's first non-finite step)")
      ->check(kNonNegative)
      ->group(after);
  app.add_option("--doom-budget", o.doom_budget,
                 "--search-doom: steps the search may replay in all (the first replay, of the run as it was, "
                 "included); when spent, it names the steps still suspected")
      ->capture_default_str()
      ->check(kPositive)
      ->group(after);
  app.add_flag("--json", o.doom_json,
               "--search-doom: print the finding as one JSON object (outcome, failing_step, step, rows, first, "
               "last, replays, steps_run, text), as Python's DoomReport.to_json(), instead of the sentence")
      ->group(after);
  app.add_option("--seed", o.seed, "Seed for initialisation, shuffling and dropout")->capture_default_str();
  app.add_option("--threads", o.threads,
                 "Intra-op threads (0: LibTorch's default; with several ranks, the cores shared between the ranks on "
                 "this machine). OpenBLAS runs on one thread unless OPENBLAS_NUM_THREADS is set")
      ->check(kNonNegative);
  add_word_option(app, "--device", o.device, all_words<DeviceChoice>(), "auto (CUDA when there is one), cpu or cuda");
  app.add_flag("--tf32", o.tf32, "CUDA: allow TF32 matmuls and convolutions (P2)");
  app.add_flag("--deterministic", o.deterministic, "Use deterministic algorithms only (P19)");
  app.add_option_function<std::vector<std::string>>(
         "--fault",
         [&o](const std::vector<std::string>& specs) {
           for (const auto& s : specs) o.faults.push_back(parse_fault(s));
         },
         "Plant a fault: KIND@STEP[:ARG][/rankR] with KIND one of nonfinite_input (ARG: sample row), "
         "log_nonpositive, sqrt_grad_zero, zero_variance_norm, exp_overflow, lr_spike "
         "(ARG: factor, default 1000, from STEP on), lr_pulse (the same at STEP alone), and the slow-onset lr_ramp and "
         "input_ramp (the LR or the float "
         "inputs times (1+ARG)^(steps since STEP); defaults 0.2, 0.3), and sample_burst (float inputs and "
         "targets times ARG, default 1e4, for 8 steps); /rankR plants it on rank R only. "
         "Repeatable. See samples/faults/")
      ->type_name("KIND@STEP[:ARG][/rankR]");
  auto* sizes = app.add_option_group("Built-in model sizes");
  sizes->add_option("--n-layer", o.n_layer, "gpt: transformer blocks")->capture_default_str();
  sizes->add_option("--n-head", o.n_head, "gpt: attention heads")->capture_default_str();
  sizes->add_option("--n-embd", o.n_embd, "gpt: embedding width")->capture_default_str();
  sizes->add_option("--seq-len", o.seq_len, "gpt: tokens per sample")->capture_default_str();
  sizes->add_option("--hidden", o.hidden, "mlp: hidden width")->capture_default_str();
  // Plain options under a help heading, not an option group: CLI11 2.4 reads
  // an option group's environment variables only when one of its flags is given.
  const std::string dist = "Data parallel (c10d): run N copies, one per rank, as torchrun does";
  app.footer(
      "Data parallel: each rank reads its shard of every global batch (--batch-size is per rank), "
      "gradients are averaged with a bucketed all-reduce, and all ranks skip, back off and fall "
      "back together. Rank R writes RUN_DIR/run-rank-R.h5 and RUN_DIR/snapshots/rank-R/. Flags "
      "override the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).");
  app.add_option("--rank", o.dist.rank, "This process's rank")->envname("RANK")->capture_default_str()->group(dist);
  app.add_option("--world-size", o.dist.world_size, "Number of processes")
      ->envname("WORLD_SIZE")
      ->capture_default_str()
      ->group(dist);
  app.add_option("--local-rank", o.dist.local_rank, "Rank on this machine (picks the CUDA device)")
      ->envname("LOCAL_RANK")
      ->capture_default_str()
      ->group(dist);
  app.add_option("--master-addr", o.dist.master_addr, "Rank 0's address (its TCPStore)")
      ->envname("MASTER_ADDR")
      ->capture_default_str()
      ->group(dist);
  app.add_option("--master-port", o.dist.master_port, "Rank 0's TCPStore port")
      ->envname("MASTER_PORT")
      ->capture_default_str()
      ->group(dist);
  add_word_option(app, "--dist-backend", o.dist.backend, all_words<DistBackend>(),
                  "auto (nccl for CUDA where built, else gloo), gloo or nccl")
      ->group(dist);
  app.add_option("--dist-timeout", o.dist.timeout_s,
                 "Seconds a rendezvous or collective may wait for the other ranks before the run "
                 "ends with an error (exit 3)")
      ->capture_default_str()
      ->check(kPositive)
      ->group(dist);
  app.add_option("--bucket-mb", o.dist.bucket_mb, "Gradient all-reduce bucket size in MiB")
      ->capture_default_str()
      ->check(kPositive)
      ->group(dist);
  app.add_option("--log-every", o.log_every, "Progress line every N steps (0: about once a second)");
  app.add_flag("--quiet", o.quiet, "No progress line, only the summary");
}

void apply_defaults(TrainOptions& o) {
  if (!o.resume.empty()) o.run_dir = o.resume;
  if (!o.search_doom.empty()) o.run_dir = o.search_doom;
  if (o.checkpoint_every > 0 && o.save.empty())
    o.save =
        (std::filesystem::path(o.run_dir) / (o.dist.world_size > 1 ? "checkpoint-rank-{rank}.h5" : "checkpoint.h5"))
            .string();
}

std::vector<std::string> with_resume_config(const std::vector<std::string>& args) {
  std::vector<std::string> out = args;
  auto resume = std::find(args.begin(), args.end(), "--resume");
  if (resume == args.end()) resume = std::find(args.begin(), args.end(), "--search-doom");
  const bool has_config = std::any_of(
      args.begin(), args.end(), [](const std::string& a) { return a == "--config" || a.rfind("--config=", 0) == 0; });
  if (resume == args.end() || resume + 1 == args.end() || has_config) return out;
  out.insert(out.begin() + 1, {"--config", (std::filesystem::path(*(resume + 1)) / kOptionsFile).string()});
  return out;
}

bool kept_in_options_file(const std::string& long_name) {
  static const std::set<std::string> kLeftOut{"help",         "config",      "resume",     "search-doom",
                                              "failing-step", "doom-budget", "json",       "rank",
                                              "local-rank",   "master-addr", "master-port"};
  return kLeftOut.count(long_name) == 0;
}

void write_options_file(const CLI::App& app, const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::filesystem::path path = std::filesystem::path(run_dir) / kOptionsFile;
  std::ofstream out(path);
  out << "# The options this run started with, as given; nanscope-train --resume RUN_DIR reads them.\n";
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char c : v) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return q + "\"";
  };
  // The app's own options and its option groups' (the model sizes, rollback), which CLI11 keeps apart.
  std::vector<const CLI::Option*> options = app.get_options();
  for (const CLI::App* group : app.get_subcommands(std::function<bool(const CLI::App*)>{}))
    for (const CLI::Option* opt : group->get_options()) options.push_back(opt);
  for (const CLI::Option* opt : options) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = opt->get_lnames().front();
    if (!kept_in_options_file(name)) continue;
    // The values as parsed: a transformed one (--amp bf16) holds what its
    // transform made of it, which the transform accepts back.
    const std::vector<std::string>& values = opt->results();
    if (opt->get_expected_max() == 0) {
      // A flag: whether it was given, as the config reader takes it. Its
      // parsed value is not that: --no-shuffle{false} gives "false", which
      // read back would mean the flag was not given.
      const bool given = values.empty() || values.back() == opt->get_flag_value(name, "");
      out << name << "=" << (given ? "true" : "false") << "\n";
    } else if (opt->get_expected_max() > 1) {
      out << name << "=[";
      for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << quoted(values[i]);
      out << "]\n";
    } else if (!values.empty()) {
      out << name << "=" << quoted(values.back()) << "\n";
    }
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
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
