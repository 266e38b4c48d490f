#include "nanscope/trainer/trainer.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include "nanscope/common/list_text.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/core/step_guard_harness.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/poison_list.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/make_optimizer.hpp"
#include "nanscope/trainer/distributed.hpp"
#include "nanscope/trainer/gradient_buckets.hpp"
#include "nanscope/trainer/interrupt.hpp"
#include "nanscope/trainer/options_cli.hpp"
#include "nanscope/trainer/progress.hpp"
#include "nanscope/trainer/resume.hpp"
#include "nanscope/trainer/schedule.hpp"
#include "nanscope/trainer/setup.hpp"

namespace nanscope::trainer {

namespace {

// What only nanscope-train knows of a run: its own options, from their
// declaration, and what they resolved to here. The guard records its own
// options beside them (recorded_config).
std::map<std::string, std::string> run_config(const TrainOptions& o, const Dataset& data, at::Device device,
                                              const TrainableModel& model) {
  std::map<std::string, std::string> config = recorded_options(o);
  config["data"] = data.source;  // the built-in data's source when --data is not given
  config["device"] = device.str();
  config["torch_version"] = TORCH_VERSION;
  config["parameters"] = std::to_string(model.parameter_count());
  return config;
}

// --fault buffer_nan: NaN into the first floating buffer, between two steps.
void poison_first_buffer(TrainableModel& model) {
  for (auto& [name, buffer] : model.named_buffers())
    if (buffer.defined() && at::isFloatingType(buffer.scalar_type())) {
      c10::NoGradGuard no_grad;
      buffer.fill_(std::nan(""));
      return;
    }
  throw std::invalid_argument("--fault buffer_nan: the model has no floating buffer");
}

}  // namespace

namespace {

// Data parallel: the rendezvous. Empty for one process.
struct Ranks {
  std::unique_ptr<ProcessGroup> group;
  std::optional<GradientBuckets> buckets;
};
void connect_ranks(Ranks& ranks, const DistOptions& dist, at::Device device) {
  if (dist.enabled()) ranks.group = ProcessGroup::connect(dist, device);
}

// Every rank starts from rank 0's weights, and the gradient buckets are laid out once.
void share_start(Ranks& ranks, const DistOptions& dist, TrainableModel& model,
                 const std::vector<at::Tensor>& parameters) {
  if (!ranks.group) return;
  ranks.group->set_context("start: weights from rank 0");
  std::vector<at::Tensor> state;
  for (auto& [name, t] : model.named_parameters()) state.push_back(t.detach());
  for (auto& [name, t] : model.named_buffers()) state.push_back(t);
  ranks.group->broadcast(state);
  ranks.buckets.emplace(*ranks.group, parameters, dist.bucket_mb);
}

ResumeState resume_state(const TrainableModel& model, const torch::optim::Optimizer& optimizer,
                         const StepGuard& guard) {
  return {optimizer_state_by_name(optimizer, model.trainable_parameters()),
          at::detail::getDefaultCPUGenerator().get_state(), guard.state()};
}

// The checkpoint after `steps_done` steps, unless the state is sick or (a
// periodic one, with training still to come) the disk is full: then the file
// at PATH (the last whole one) stays, and run.h5 and the log say so. Returns
// whether it was written.
bool write_checkpoint(const std::string& path, TrainableModel& model, torch::optim::Optimizer& optimizer,
                      StepGuard& guard, int64_t steps_done, bool keep_previous, TrainSummary& summary,
                      std::ostream& log, const std::string& who, bool periodic) {
  // The rows up to the checkpoint reach run.h5 first: a resume keeps them and redoes only what follows.
  guard.flush();
  const ResumeState state = resume_state(model, optimizer, guard);
  const double loss = summary.last_finite_step >= 0 ? summary.last_finite_loss : std::nan("");
  // The file now at PATH becomes the one before it only if a new one replaces it.
  std::string why;
  try {
    const StateHealth health = save_checkpoint(path, model, steps_done, &state, &optimizer, loss, keep_previous);
    if (health.finite()) {
      summary.saved_step = steps_done;
      summary.saved_path = path;
      return true;
    }
    why = health.text() + " non-finite";
  } catch (const format::WriteError& e) {
    // A full disk fails this checkpoint, not the run: the last one stays whole
    // at PATH, and the next checkpoint tries again. The last save of a run is
    // its result: failing it is the run's failure (exit 1).
    if (!periodic) throw;
    why = e.what();
  }
  ++summary.saves_refused;
  const std::string kept = summary.saved_step >= 0
                               ? path + " keeps the model after step " + std::to_string(summary.saved_step - 1)
                               : "nothing written";
  const std::string text =
      "checkpoint after step " + std::to_string(steps_done - 1) + " not written: " + why + "; " + kept;
  StepGuardHarness(guard).record_event(steps_done - 1, format::EventKind::save_refused, text);
  guard.flush();
  log << who << text << "\n";
  return false;
}

GuardOptions guard_options(const TrainOptions& o, std::map<std::string, std::string> config, std::ostream& log,
                           const std::string& who) {
  GuardOptions g = o;  // the guard's own options, as given
  g.optimizer_name = to_string(o.optimizer);
  g.config = std::move(config);
  g.rank = o.dist.rank;
  g.world_size = o.dist.world_size;
  g.log = &log;
  g.log_prefix = who;
  return g;
}

}  // namespace

namespace {

// Everything a run holds from its set-up to its end.
struct Session {
  at::Device device{at::kCPU};
  std::vector<Fault> faults;  // this rank's
  std::string who;            // "[rank R] " with several ranks
  Dataset data;
  std::unique_ptr<TrainableModel> model;
  Ranks ranks;
  std::optional<Resumption> resumed;
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<StepGuard> guard;
  std::optional<BatchSampler> sampler;
  int64_t first_step = 0;
  std::string poison_list;          // RUN_DIR/poisoned_samples.jsonl
  uintmax_t poison_list_bytes = 0;  // its size when last read: it is read again when it grows or shrinks
};

// "data set row 363", "data set rows 3, 9 and 40".
std::string listed_rows_text(const std::vector<int64_t>& rows) {
  std::vector<std::string> words;
  for (int64_t row : rows) words.push_back(std::to_string(row));
  return std::string(rows.size() == 1 ? "data set row " : "data set rows ") + first_few_text(words, 8);
}

// The sampler leaves out what the poison list holds: read again whenever the
// file's size changed (this rank's guard, another rank's, or a person edited it).
void follow_poison_list(Session& s) {
  std::error_code ec;
  const uintmax_t bytes =
      std::filesystem::exists(s.poison_list, ec) ? std::filesystem::file_size(s.poison_list, ec) : 0;
  if (bytes == s.poison_list_bytes) return;
  s.sampler->leave_out(format::read_poison_list(s.poison_list));
  s.poison_list_bytes = bytes;
}

// Device, data, model, ranks, resume, optimizer and guard, and the run's first line.
void prepare(Session& s, const TrainOptions& o, std::ostream& log) {
  const DistOptions& dist = o.dist;
  s.device = select_device(o.device);
  if (dist.enabled() && s.device.is_cuda()) s.device = at::Device(at::kCUDA, dist.local_rank);
  configure_runtime(o, s.device);
  s.faults = faults_on_rank(o.faults, dist.rank);
  s.who = dist.enabled() ? "[rank " + std::to_string(dist.rank) + "] " : "";
  s.data = make_dataset(o);
  s.model = prepared_model(o, s.data, s.device, log);
  s.poison_list = format::poison_list_path(o.run_dir);
  // A new run keeps a list it finds, its samples left out from the first step (rank 0 rewrites it before the
  // ranks meet; each reads it after).
  if (!o.resume.empty() || dist.rank != 0) {
  } else if (const size_t kept = format::start_poison_list_anew(s.poison_list); kept > 0) {
    log << s.who << "poison list: " << kept << " sample(s) listed before this run are left out (" << s.poison_list
        << ")\n";
  }
  connect_ranks(s.ranks, dist, s.device);
  s.resumed = resumption(o, *s.model, s.ranks.group.get(), s.device);
  s.parameters = trainable_tensors(*s.model);
  share_start(s.ranks, dist, *s.model, s.parameters);
  s.optimizer = make_optimizer(o.optimizer, s.parameters, o.lr, o.weight_decay);
  GuardOptions options = guard_options(o, run_config(o, s.data, s.device, *s.model), log, s.who);
  if (s.resumed) {
    s.first_step = s.resumed->steps_done;
    options.resume_after_step = s.first_step - 1;
    options.resume_from = "resumed from " + s.resumed->checkpoint + " (saved after step " +
                          std::to_string(s.first_step - 1) + "); rows after it were dropped and are redone";
  }
  s.guard = std::make_unique<StepGuard>(*s.model, *s.optimizer, options);
  // The model's planted fault of each step, for the step and every re-run of it.
  StepGuardHarness(*s.guard).set_step_setup(
      [&model = *s.model, faults = s.faults](int64_t step) { return planting(model, model_fault_at(faults, step)); });
  if (s.resumed) {
    restore_optimizer_and_rng(s.resumed->state, *s.model, *s.optimizer);
    s.guard->restore(s.resumed->state.guard);
    if (!s.resumed->passed_over.empty()) log << s.who << "resume: passed over " << s.resumed->passed_over << "\n";
    log << s.who << "resume: " << s.resumed->checkpoint << ", from step " << s.first_step
        << (s.resumed->health_checked ? " (healthy)" : "") << "\n";
  }
  // Each rank reads its own shard: rows [rank*B, (rank+1)*B) of every global batch.
  s.sampler.emplace(s.data.size(), o.batch_size, o.shuffle, o.seed, dist.rank, dist.world_size);
  follow_poison_list(s);

  log << s.who << "nanscope-train: " << o.model << " (" << s.model->parameter_count() << " parameters) on "
      << s.data.source << " (" << s.data.size() << " samples), " << o.steps << " steps, amp " << amp_name(o.amp)
      << ", device " << s.device.str() << ", LibTorch " << TORCH_VERSION;
  if (s.ranks.group)
    log << ", rank " << dist.rank << " of " << dist.world_size << " (c10d " << s.ranks.group->backend() << ", "
        << s.ranks.buckets->bucket_count() << " gradient bucket(s))";
  log << "\n";
}

// One guarded step, its LR from the schedule; a lost peer is said in this
// rank's run file, which stays whole.
GuardedStep run_step(Session& s, const TrainOptions& o, int64_t step, bool interrupted) {
  StepContext context = StepContext::numbered(step);
  // --schedule-on-skip hold: skipped steps do not move the schedule on.
  const int64_t schedule_position = o.schedule_holds_on_skip ? s.guard->applied_steps() : step;
  // The schedule's LR; the guard applies its own cuts (fallback, rollback) to the update.
  context.lr = scheduled_lr(o.schedule, o.lr, o.warmup, o.steps, schedule_position) * lr_multiplier_at(s.faults, step);
  set_lr(*s.optimizer, context.lr);
  follow_poison_list(s);
  context.batch_rows = s.sampler->rows(step);
  const auto [inputs, targets] = planted_batch(s.data, s.faults, step, context.batch_rows, s.device);
  if (s.ranks.buckets) {
    context.averager = &*s.ranks.buckets;
    context.stop_requested = interrupted;
    s.ranks.group->set_context("step " + std::to_string(step));
  }
  try {
    return s.guard->closure_step(inputs, targets, context);
  } catch (const DistributedError& e) {
    StepGuardHarness(*s.guard).record_event(step, format::EventKind::dist_error, e.what());
    s.guard->flush();
    throw;
  }
}

// What the summary keeps of each step.
struct Tally {
  TrainSummary summary;
  std::vector<double> step_times, allreduce_times, collectives;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  // collectives_issued: by the step, on several ranks.
  void add(const GuardedStep& result, int64_t step, bool several_ranks, int64_t collectives_issued) {
    const StepOutcome& outcome = result.outcome;
    step_times.push_back(result.seconds);
    if (several_ranks) {
      allreduce_times.push_back(outcome.allreduce_seconds);
      collectives.push_back(double(collectives_issued));
    }
    summary.steps_run = step + 1;
    if (!outcome.skipped) {
      summary.last_finite_loss = outcome.loss;
      summary.last_finite_step = step;
    } else {
      ++summary.skipped;
    }
    summary.final_lr = result.lr;
  }
};

// The end: the --save checkpoint (unless the last periodic one is it), the
// ranks' last barrier, and the summary's totals.
TrainSummary finish(Session& s, const TrainOptions& o, Tally& tally, bool interrupted, int64_t checkpoint_saved_after,
                    std::ostream& log) {
  TrainSummary& summary = tally.summary;
  const StepGuard& guard = *s.guard;
  summary.interrupted = interrupted;
  summary.final_loss_scale = guard.loss_scale();
  summary.fallback_step = guard.fallback_step();
  summary.rollbacks = guard.rollbacks();
  summary.snapshots = guard.snapshots();
  summary.first_nonfinite_ranks = StepGuardHarness(*s.guard).first_nonfinite_ranks();
  s.guard->flush();
  if (!o.save.empty()) {
    const std::string path = checkpoint_path_for_rank(o.save, o.dist);
    if (!path.empty() && checkpoint_saved_after != summary.steps_run)
      write_checkpoint(path, *s.model, *s.optimizer, *s.guard, summary.steps_run,
                       o.dist.enabled() || o.checkpoint_every > 0, summary, log, s.who, false);
  }
  if (s.ranks.group) {
    s.ranks.group->set_context("end of run");
    s.ranks.group->barrier();  // no rank tears its connections down while a peer still reads
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - tally.start).count();
  summary.steps_per_second = total > 0 ? double(summary.steps_run) / total : 0;
  summary.median_step_time = median(tally.step_times);
  if (!tally.allreduce_times.empty()) {
    summary.median_allreduce_time = median(tally.allreduce_times);
    summary.median_collectives = std::llround(median(tally.collectives));
    summary.gradient_buckets = int64_t(s.ranks.buckets->bucket_count());
    summary.world_size = o.dist.world_size;
  }
  return summary;
}

}  // namespace

TrainSummary run(const TrainOptions& o, std::ostream& log) {
  Session s;
  prepare(s, o, log);
  const InterruptFlag interrupt;
  Tally tally;
  tally.summary.run_file = s.guard->run_file();
  tally.summary.steps_run = s.first_step;
  if (s.resumed) {
    tally.summary.saved_step = s.first_step;
    tally.summary.saved_path = s.resumed->checkpoint;
  }
  ProgressLine progress(log, o.log_every, o.quiet || o.dist.rank != 0);
  bool stop = false;
  int64_t checkpoint_saved_after = -1;  // the last step's periodic checkpoint is also the final one
  for (int64_t step = s.first_step; step < o.steps && !stop; ++step) {
    const int64_t issued_before = s.ranks.group ? s.ranks.group->collectives_issued() : 0;
    const GuardedStep result = run_step(s, o, step, interrupt.raised());
    const int64_t issued = s.ranks.group ? s.ranks.group->collectives_issued() - issued_before : 0;
    const StepOutcome& outcome = result.outcome;
    if (!result.listed_samples.empty())
      log << s.who << "step " << step << ": " << listed_rows_text(result.listed_samples)
          << " left out from the next epoch on (" << s.poison_list << ")\n";
    stop = s.ranks.buckets ? outcome.stop_requested : interrupt.raised();
    tally.add(result, step, bool(s.ranks.buckets), issued);
    const TrainSummary& sum = tally.summary;
    progress.update({step, o.steps, sum.skipped, outcome.loss, !outcome.finite(), sum.last_finite_loss,
                     sum.last_finite_step, s.guard->loss_scale(), outcome.grad_norm, precision_name(s.guard->amp())});
    if (buffer_poisoned_after(s.faults, step)) poison_first_buffer(*s.model);
    if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) {
      if (const std::string path = checkpoint_path_for_rank(o.save, o.dist); !path.empty()) {
        if (write_checkpoint(path, *s.model, *s.optimizer, *s.guard, step + 1, true, tally.summary, log, s.who, true))
          checkpoint_saved_after = step + 1;
        if (o.keep_checkpoints > 0 && tally.summary.saved_step == step + 1)
          keep_by_step(path, step + 1, o.keep_checkpoints);
      }
    }
  }
  return finish(s, o, tally, stop, checkpoint_saved_after, log);
}

void print_summary(const TrainSummary& s, std::ostream& out) {
  out << "summary: " << s.steps_run << " steps" << (s.interrupted ? " (interrupted)" : "") << ", " << s.skipped
      << " skipped, " << (s.rollbacks > 0 ? std::to_string(s.rollbacks) + " rollback(s), " : std::string())
      << "fallback "
      << (s.fallback_step >= 0 ? "at step " + std::to_string(s.fallback_step) : std::string("not needed")) << ", "
      << (s.last_finite_step < 0 ? std::string("no finite loss")
                                 : "last finite loss " + number_text(s.last_finite_loss) + " (step " +
                                       std::to_string(s.last_finite_step) + ")")
      << ", lr " << s.final_lr << ", loss scale " << s.final_loss_scale << ", " << s.steps_per_second
      << " steps/s (median step " << s.median_step_time * 1e3 << " ms)\n";
  if (s.world_size > 1)
    out << "ranks: " << s.world_size << ", median all-reduce " << s.median_allreduce_time * 1e3 << " ms ("
        << (s.median_step_time > 0 ? 100.0 * s.median_allreduce_time / s.median_step_time : 0.0)
        << "% of the median step), " << s.median_collectives << " collective(s) per step (median) for "
        << s.gradient_buckets << " gradient bucket(s)"
        << (s.first_nonfinite_ranks.empty()
                ? ""
                : ", first non-finite rank(s) " + format::rank_list_text(s.first_nonfinite_ranks))
        << "\n";
  if (!s.saved_path.empty() || s.saves_refused > 0)
    out << "saved: "
        << (s.saved_step >= 0 ? s.saved_path + " (the model after step " + std::to_string(s.saved_step - 1) + ")"
                              : std::string("nothing"))
        << (s.saves_refused > 0
                ? ", " + std::to_string(s.saves_refused) + " checkpoint(s) not written (a non-finite state, or no room)"
                : std::string())
        << "\n";
  out << "run file: " << s.run_file << "\n";
}

}  // namespace nanscope::trainer
