#include "trainer.hpp"

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

#include "distributed.hpp"
#include "gradient_buckets.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/stats.hpp"
#include "progress.hpp"
#include "schedule.hpp"
#include "setup.hpp"

namespace nanscope {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::map<std::string, std::string> run_config(const TrainOptions& o, const std::vector<Fault>& planted,
                                              const Dataset& data, at::Device device, const TrainableModel& model) {
  std::string faults;
  for (const auto& f : planted)
    faults +=
        (faults.empty() ? "" : ",") + std::string(fault_name(f.kind)) + "@" + std::to_string(f.step) + ":" + fmt(f.arg);
  return {{"model", o.model},
          {"data", data.source},
          {"init", o.init},
          {"steps", std::to_string(o.steps)},
          {"batch_size", std::to_string(o.batch_size)},
          {"lr", fmt(o.lr)},
          {"optimizer", o.optimizer},
          {"weight_decay", fmt(o.weight_decay)},
          {"schedule", o.schedule},
          {"warmup", std::to_string(o.warmup)},
          {"clip", fmt(o.clip)},
          {"amp", amp_name(o.amp)},
          {"lr_backoff", fmt(o.lr_backoff)},
          {"fallback", fallback_mode_name(o.fallback)},
          {"fp32_modules", fp32_modules_flag_value(o.fp32_modules)},
          {"schedule_on_skip", o.schedule_holds_on_skip ? "hold" : "advance"},
          {"z_loss", fmt(o.z_loss)},
          {"shuffle", o.shuffle ? "on" : "off"},
          {"probe", o.probe ? "on" : "off"},
          {"seed", std::to_string(o.seed)},
          {"capture", o.capture_every_step ? "every-step" : "on-failure"},
          {"act_absmax_every", std::to_string(o.act_absmax_every)},
          {"max_snapshots", std::to_string(o.max_snapshots)},
          {"max_nonfinite_run", std::to_string(o.max_nonfinite_run)},
          {"warn", o.warn ? "on" : "off"},
          {"rollback", o.rollback.enabled ? "on" : "off"},
          {"rollback_every", std::to_string(o.rollback.every)},
          {"max_rollbacks", std::to_string(o.rollback.max_rollbacks)},
          {"device", device.str()},
          {"faults", faults},
          {"torch_version", TORCH_VERSION},
          {"parameters", std::to_string(model.parameter_count())},
          {"rank", std::to_string(o.dist.rank)},
          {"world_size", std::to_string(o.dist.world_size)}};
}

// --save with several ranks: rank 0 writes it (the weights are the same on
// every rank), unless the path names "{rank}", which each rank fills in.
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

std::string checkpoint_path_for_rank(const std::string& path, const DistOptions& d) {
  const auto at = path.find("{rank}");
  if (at != std::string::npos) return std::string(path).replace(at, 6, std::to_string(d.rank));
  return d.rank == 0 ? path : "";
}

}  // namespace

namespace {

// The model from --model (and --init), on its device, ready to train.
std::unique_ptr<TrainableModel> prepared_model(const TrainOptions& o, const Dataset& data, at::Device device,
                                               std::ostream& log) {
  std::unique_ptr<TrainableModel> model = make_model(o, data);
  if (!o.init.empty()) {
    const int64_t from = load_checkpoint(o.init, *model);
    log << "init: " << o.init << " (saved at step " << from << ")\n";
  }
  check_compatibility(o, *model, data, device);
  model->to(device, at::kFloat);
  model->set_training(true);
  model->set_z_loss(o.z_loss);
  return model;
}

// Data parallel: the rendezvous. Empty for one process.
struct Ranks {
  std::unique_ptr<ProcessGroup> group;
  std::optional<GradientBuckets> buckets;
};
Ranks connect_ranks(const DistOptions& dist, at::Device device) {
  Ranks ranks;
  if (dist.enabled()) ranks.group = ProcessGroup::connect(dist, device);
  return ranks;
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

// Data parallel: the newest checkpoint every rank has, among each rank's
// newest and the one before it (a kill during a checkpoint round can leave the
// ranks a round apart). Every rank sees every rank's steps, so all choose
// alike, or all fail with the same message.
std::string agreed_checkpoint(const std::string& current, const TrainOptions& o, ProcessGroup& group,
                              at::Device device) {
  const int world = group.world_size();
  const std::array<std::string, 2> paths{current, current.empty() ? "" : previous_checkpoint_path(current)};
  std::array<int64_t, 2> mine{-1, -1};
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty() || !std::filesystem::exists(paths[i])) continue;
    try {
      mine[i] = checkpoint_step(paths[i]);
    } catch (const format::FormatError&) {
      // Unreadable: as if absent; the other one (or the error below) decides.
    }
  }
  // Each rank writes its two steps into its own row; a sum gathers them all.
  at::Tensor steps = at::zeros({world, 2}, at::kDouble);
  steps[group.rank()][0] = double(mine[0]);
  steps[group.rank()][1] = double(mine[1]);
  at::Tensor gathered = steps.to(device);
  group.set_context("resume: agreeing on a checkpoint");
  group.all_reduce({{gathered, ProcessGroup::Reduce::sum}});
  const at::Tensor all = gathered.to(at::kCPU);
  auto held_by_all = [&](int64_t step) {
    for (int r = 0; r < world; ++r)
      if (all[r][0].item<double>() != double(step) && all[r][1].item<double>() != double(step)) return false;
    return true;
  };
  int64_t best = -1;
  size_t which = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i] > best && held_by_all(mine[i])) best = mine[i], which = i;
  if (best >= 0) return paths[which];
  std::string held;
  for (int r = 0; r < world; ++r) {
    held += (r ? "; rank " : "rank ") + std::to_string(r) + ":";
    bool any = false;
    for (int i = 0; i < 2; ++i)
      if (const auto s = int64_t(all[r][i].item<double>()); s >= 0) held += " " + std::to_string(s), any = true;
    if (!any) held += " none";
  }
  throw std::invalid_argument("--resume " + o.resume + ": the ranks' checkpoints share no step (steps done: " + held +
                              "); resuming several ranks needs a checkpoint per rank (--save with {rank})");
}

// --resume: the checkpoint the run directory's run wrote last, with what it
// needs to go on. Throws std::invalid_argument naming what is missing.
struct Resumption {
  std::string checkpoint;
  int64_t steps_done = 0;
  ResumeState state;
  std::string passed_over;  // newer checkpoints that were not healthy, and why
  // One process: chosen by health. Several ranks choose the newest step all
  // of them hold (agreed_checkpoint), which nanscope only writes healthy.
  bool health_checked = false;
};

// The newest of PATH and the one kept before it whose state is healthy,
// loaded into `model`. Files this nanscope writes are healthy by
// construction (a sick state is never saved); one written by an older
// version or another tool is judged by its tensors once loaded.
std::string newest_healthy_checkpoint(const std::string& path, TrainableModel& model, int64_t& steps_done,
                                      std::string& passed_over) {
  std::vector<std::pair<int64_t, std::string>> candidates;
  for (const std::string& p : {path, previous_checkpoint_path(path)}) {
    if (!std::filesystem::exists(p)) continue;
    try {
      candidates.emplace_back(checkpoint_step(p), p);
    } catch (const format::FormatError& e) {
      passed_over += (passed_over.empty() ? "" : "; ") + p + ": unreadable (" + e.what() + ")";
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [step, p] : candidates) {
    const std::optional<CheckpointHealth> recorded = checkpoint_health(p);
    if (recorded && !recorded->finite) {
      passed_over += (passed_over.empty() ? "" : "; ") + p + " (step " + std::to_string(step) + "): recorded as sick";
      continue;
    }
    steps_done = load_checkpoint(p, model);
    if (const StateHealth health = state_health(model, nullptr); !health.finite()) {
      passed_over +=
          (passed_over.empty() ? "" : "; ") + p + " (step " + std::to_string(step) + "): non-finite " + health.text();
      continue;
    }
    return p;
  }
  throw std::invalid_argument("--resume: no healthy checkpoint at " + path + " or " + previous_checkpoint_path(path) +
                              (passed_over.empty() ? std::string() : " (" + passed_over + ")"));
}
std::optional<Resumption> resumption(const TrainOptions& o, TrainableModel& model, const Ranks& ranks,
                                     at::Device device) {
  if (o.resume.empty()) return std::nullopt;
  Resumption r;
  const std::string current = checkpoint_path_for_rank(o.save, o.dist);
  if (ranks.group) {
    r.checkpoint = agreed_checkpoint(current, o, *ranks.group, device);
    r.steps_done = load_checkpoint(r.checkpoint, model);
  } else {
    if (current.empty() || !std::filesystem::exists(current))
      throw std::invalid_argument("--resume " + o.resume + ": no checkpoint" +
                                  (current.empty() ? std::string() : " at " + current) +
                                  " (resuming needs a run started with --checkpoint-every N)");
    r.checkpoint = newest_healthy_checkpoint(current, model, r.steps_done, r.passed_over);
    r.health_checked = true;
  }
  std::optional<ResumeState> state = load_resume_state(r.checkpoint);
  if (!state)
    throw std::invalid_argument(
        "--resume " + o.resume + ": " + r.checkpoint +
        " holds weights only (written by an older nanscope); it can --init a run, not resume one");
  r.state = std::move(*state);
  return r;
}

ResumeState resume_state(const TrainableModel& model, const torch::optim::Optimizer& optimizer,
                         const StepGuard& guard) {
  return {optimizer_state_by_name(optimizer, model.trainable_parameters()),
          at::detail::getDefaultCPUGenerator().get_state(), guard.state()};
}

// The checkpoint after `steps_done` steps, unless the state is sick: then the
// file at PATH (the last healthy one) stays, and run.h5 and the log say so.
void write_checkpoint(const std::string& path, TrainableModel& model, torch::optim::Optimizer& optimizer,
                      StepGuard& guard, int64_t steps_done, bool keep_previous, TrainSummary& summary,
                      std::ostream& log, const std::string& who) {
  // The rows up to the checkpoint reach run.h5 first: a resume keeps them and redoes only what follows.
  guard.writer().flush();
  const ResumeState state = resume_state(model, optimizer, guard);
  const double loss = summary.last_finite_step >= 0 ? summary.last_finite_loss : std::nan("");
  // The file now at PATH becomes the one before it only if a new one replaces it.
  if (keep_previous && state_health(model, &optimizer).finite()) keep_as_previous(path);
  const StateHealth health = save_checkpoint(path, model, steps_done, &state, &optimizer, loss);
  if (health.finite()) {
    summary.saved_step = steps_done;
    summary.saved_path = path;
    return;
  }
  ++summary.saves_refused;
  const std::string kept = summary.saved_step >= 0
                               ? path + " keeps the model after step " + std::to_string(summary.saved_step - 1)
                               : "nothing written";
  const std::string text = "checkpoint after step " + std::to_string(steps_done - 1) +
                           " not written: " + health.text() + " non-finite; " + kept;
  guard.writer().event(steps_done - 1, format::EventKind::save_refused, text);
  guard.writer().flush();
  log << who << text << "\n";
}

GuardOptions guard_options(const TrainOptions& o, std::map<std::string, std::string> config, std::ostream& log,
                           const std::string& who) {
  GuardOptions g;
  g.run_dir = o.run_dir;
  g.amp = o.amp;
  g.clip = o.clip;
  g.fallback = o.fallback;
  g.fp32_modules = o.fp32_modules;
  g.lr_backoff = o.lr_backoff;
  g.fallback_min_scale = o.fallback_min_scale;
  g.probe = o.probe;
  g.capture_every_step = o.capture_every_step;
  g.act_absmax_every = o.act_absmax_every;
  g.max_snapshots = o.max_snapshots;
  g.max_nonfinite_run = o.max_nonfinite_run;
  g.warn = o.warn;
  g.rollback = o.rollback;
  g.optimizer_name = o.optimizer;
  g.config = std::move(config);
  g.rank = o.dist.rank;
  g.world_size = o.dist.world_size;
  g.log = &log;
  g.log_prefix = who;
  return g;
}

}  // namespace

TrainSummary run(const TrainOptions& o, std::ostream& log) {
  const DistOptions& dist = o.dist;
  at::Device device = select_device(o.device);
  if (dist.enabled() && device.is_cuda()) device = at::Device(at::kCUDA, dist.local_rank);
  configure_runtime(o, device);
  const std::vector<Fault> faults = faults_on_rank(o.faults, dist.rank);
  const std::string who = dist.enabled() ? "[rank " + std::to_string(dist.rank) + "] " : "";
  Dataset data = make_dataset(o);
  std::unique_ptr<TrainableModel> model = prepared_model(o, data, device, log);
  Ranks ranks = connect_ranks(dist, device);
  const std::optional<Resumption> resumed = resumption(o, *model, ranks, device);
  const std::vector<at::Tensor> parameters = trainable_tensors(*model);
  share_start(ranks, dist, *model, parameters);
  auto optimizer = make_optimizer(o.optimizer, parameters, o.lr, o.weight_decay);
  GuardOptions options = guard_options(o, run_config(o, faults, data, device, *model), log, who);
  int64_t first_step = 0;
  if (resumed) {
    first_step = resumed->steps_done;
    options.resume_after_step = first_step - 1;
    options.resume_from = "resumed from " + resumed->checkpoint + " (saved after step " +
                          std::to_string(first_step - 1) + "); rows after it were dropped and are redone";
  }
  StepGuard guard(*model, *optimizer, options);
  if (resumed) {
    load_optimizer_state_by_name(*optimizer, model->trainable_parameters(), resumed->state.optimizer_state);
    guard.restore(resumed->state.guard);
    at::Generator cpu = at::detail::getDefaultCPUGenerator();
    cpu.set_state(resumed->state.cpu_rng);
    if (!resumed->passed_over.empty()) log << who << "resume: passed over " << resumed->passed_over << "\n";
    log << who << "resume: " << resumed->checkpoint << ", from step " << first_step
        << (resumed->health_checked ? " (healthy)" : "") << "\n";
  }
  // Each rank reads its own shard: rows [rank*B, (rank+1)*B) of every global batch.
  BatchSampler sampler(data.size(), o.batch_size, o.shuffle, o.seed, dist.rank, dist.world_size);

  log << who << "nanscope-train: " << o.model << " (" << model->parameter_count() << " parameters) on " << data.source
      << " (" << data.size() << " samples), " << o.steps << " steps, amp " << amp_name(o.amp) << ", device "
      << device.str() << ", LibTorch " << TORCH_VERSION;
  if (ranks.group)
    log << ", rank " << dist.rank << " of " << dist.world_size << " (c10d " << ranks.group->backend() << ", "
        << ranks.buckets->bucket_count() << " gradient bucket(s))";
  log << "\n";

  g_interrupted = false;
  auto previous_handler = std::signal(SIGINT, on_interrupt);
  TrainSummary summary;
  summary.run_file = guard.run_file();
  summary.steps_run = first_step;
  if (resumed) {
    summary.saved_step = first_step;
    summary.saved_path = resumed->checkpoint;
  }
  std::vector<double> step_times, allreduce_times;
  ProgressLine progress(log, o.log_every, o.quiet || dist.rank != 0);
  const auto run_start = std::chrono::steady_clock::now();
  bool stop = false;
  int64_t checkpoint_saved_after = -1;  // the last step's periodic checkpoint is also the final one

  for (int64_t step = first_step; step < o.steps && !stop; ++step) {
    StepContext context;
    // --schedule-on-skip hold: skipped steps do not move the schedule on.
    const int64_t schedule_position = o.schedule_holds_on_skip ? guard.applied_steps() : step;
    context.lr = scheduled_lr(o.schedule, o.lr, o.warmup, o.steps, schedule_position) * guard.lr_multiplier() *
                 lr_multiplier_at(faults, step);
    set_lr(*optimizer, context.lr);
    context.batch_rows = sampler.rows(step);
    at::Tensor inputs = data.inputs.index_select(0, context.batch_rows);
    if (auto row = poisoned_row_at(faults, step)) inputs[*row].fill_(std::nan(""));
    if (const double scale = input_scale_at(faults, step); scale != 1.0 && inputs.is_floating_point())
      inputs = inputs * scale;
    inputs = inputs.to(device);
    at::Tensor targets = data.targets.index_select(0, context.batch_rows);
    if (const double scale = target_scale_at(faults, step); scale != 1.0 && targets.is_floating_point())
      targets = targets * scale;
    targets = targets.to(device);
    context.fault = model_fault_at(faults, step);
    if (ranks.buckets) {
      context.averager = &*ranks.buckets;
      context.stop_requested = g_interrupted;
      ranks.group->set_context("step " + std::to_string(step));
    }

    GuardedStep result;
    try {
      result = guard.step(step, inputs, targets, context);
    } catch (const DistributedError& e) {
      // A peer is gone: say so in this rank's run file, which stays whole.
      guard.writer().event(step, format::EventKind::dist_error, e.what());
      guard.writer().flush();
      throw;
    }
    const StepOutcome& outcome = result.outcome;
    stop = ranks.buckets ? outcome.stop_requested : g_interrupted.load();
    step_times.push_back(result.seconds);
    if (ranks.buckets) allreduce_times.push_back(outcome.allreduce_seconds);
    summary.steps_run = step + 1;
    if (!outcome.skipped) {
      summary.last_finite_loss = outcome.loss;
      summary.last_finite_step = step;
    } else {
      ++summary.skipped;
    }
    summary.final_lr = result.lr;
    summary.final_loss_scale = guard.scaler().scale();
    progress.update({step, o.steps, summary.skipped, outcome.loss, !outcome.finite(), summary.last_finite_loss,
                     summary.last_finite_step, guard.scaler().scale(), outcome.grad_norm, precision_name(guard.amp())});
    if (buffer_poisoned_after(faults, step)) poison_first_buffer(*model);
    if (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) {
      const std::string path = checkpoint_path_for_rank(o.save, dist);
      if (!path.empty()) {
        write_checkpoint(path, *model, *optimizer, guard, step + 1, true, summary, log, who);
        checkpoint_saved_after = step + 1;
      }
    }
  }
  std::signal(SIGINT, previous_handler);
  summary.interrupted = stop;
  summary.fallback_step = guard.fallback_step();
  summary.rollbacks = guard.rollbacks();
  summary.snapshots = guard.snapshots();
  summary.first_nonfinite_ranks = guard.first_nonfinite_ranks();
  guard.writer().flush();
  if (!o.save.empty()) {
    const std::string path = checkpoint_path_for_rank(o.save, dist);
    if (!path.empty() && checkpoint_saved_after != summary.steps_run)
      write_checkpoint(path, *model, *optimizer, guard, summary.steps_run, dist.enabled() || o.checkpoint_every > 0,
                       summary, log, who);
  }
  if (ranks.group) {
    ranks.group->set_context("end of run");
    ranks.group->barrier();  // no rank tears its connections down while a peer still reads
  }

  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  summary.steps_per_second = total > 0 ? double(summary.steps_run) / total : 0;
  summary.median_step_time = median(step_times);
  if (!allreduce_times.empty()) {
    summary.median_allreduce_time = median(allreduce_times);
    summary.world_size = dist.world_size;
  }
  return summary;
}

void print_summary(const TrainSummary& s, std::ostream& out) {
  out << "summary: " << s.steps_run << " steps" << (s.interrupted ? " (interrupted)" : "") << ", " << s.skipped
      << " skipped, " << (s.rollbacks > 0 ? std::to_string(s.rollbacks) + " rollback(s), " : std::string())
      << "fallback "
      << (s.fallback_step >= 0 ? "at step " + std::to_string(s.fallback_step) : std::string("not needed")) << ", "
      << (s.last_finite_step < 0
              ? std::string("no finite loss")
              : "last finite loss " + fmt(s.last_finite_loss) + " (step " + std::to_string(s.last_finite_step) + ")")
      << ", lr " << s.final_lr << ", loss scale " << s.final_loss_scale << ", " << s.steps_per_second
      << " steps/s (median step " << s.median_step_time * 1e3 << " ms)\n";
  if (s.world_size > 1)
    out << "ranks: " << s.world_size << ", median all-reduce " << s.median_allreduce_time * 1e3 << " ms ("
        << (s.median_step_time > 0 ? 100.0 * s.median_allreduce_time / s.median_step_time : 0.0)
        << "% of the median step)"
        << (s.first_nonfinite_ranks.empty()
                ? ""
                : ", first non-finite rank(s) " + format::rank_list_text(s.first_nonfinite_ranks))
        << "\n";
  if (!s.saved_path.empty() || s.saves_refused > 0)
    out << "saved: "
        << (s.saved_step >= 0 ? s.saved_path + " (the model after step " + std::to_string(s.saved_step - 1) + ")"
                              : std::string("nothing"))
        << (s.saves_refused > 0
                ? ", " + std::to_string(s.saves_refused) + " checkpoint(s) refused: the state was non-finite"
                : std::string())
        << "\n";
  out << "run file: " << s.run_file << "\n";
}

}  // namespace nanscope
