#include "nanscope/trainer/doom_offline.hpp"

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/doom_after_run.hpp"
#include "nanscope/core/fp32_modules.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/make_optimizer.hpp"
#include "nanscope/trainer/resume.hpp"
#include "nanscope/trainer/setup.hpp"

namespace nanscope::trainer {

namespace {

// The run's checkpoints saved before `failing` (steps done <= failing), newest
// first: the newest, the one before it, and those kept by step.
std::vector<std::pair<int64_t, std::string>> checkpoints_before(const TrainOptions& o, int64_t failing) {
  if (o.save.empty())
    throw std::invalid_argument("--search-doom " + o.search_doom +
                                ": the run wrote no checkpoint (the search replays from one: --checkpoint-every N)");
  std::map<int64_t, std::string> found;  // by steps done: a step's file and its link are one
  for (const std::string& path : {o.save, previous_checkpoint_path(o.save)})
    if (std::filesystem::exists(path)) found.emplace(checkpoint_step(path), path);
  for (const auto& [done, path] : checkpoints_kept_by_step(o.save)) found.emplace(done, path);
  std::vector<std::pair<int64_t, std::string>> before;
  for (auto it = found.rbegin(); it != found.rend(); ++it)
    if (it->first <= failing) before.push_back(*it);
  if (before.empty())
    throw std::invalid_argument("--search-doom " + o.search_doom + ": no checkpoint kept from before step " +
                                std::to_string(failing) + " (the run's are later: keep older ones with " +
                                "--keep-checkpoints N)");
  return before;
}

// What the replays need of the model: built, loaded from the checkpoint, the
// CPU generator as the checkpoint saved it.
struct Replayable {
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<std::string> fp32_modules;
};

Replayable load_replayable(const TrainOptions& o, const Dataset& data, at::Device device, const std::string& path,
                           std::ostream& log) {
  Replayable r;
  r.model = prepared_model(o, data, device, log);
  load_checkpoint(path, *r.model);
  r.optimizer = make_optimizer(o.optimizer, trainable_tensors(*r.model), o.lr, o.weight_decay);
  const std::optional<ResumeState> state = load_resume_state(path);
  if (!state)
    throw std::invalid_argument(path + " holds weights only (no optimizer state): it cannot be replayed from");
  restore_optimizer_and_rng(*state, *r.model, *r.optimizer);
  r.fp32_modules = state->guard.fp32_modules;
  return r;
}

}  // namespace

OfflineDoomSearch search_doom_offline(const TrainOptions& o, std::ostream& log) {
  if (o.dist.world_size > 1)
    throw std::invalid_argument("--search-doom replays in one process: a run of several ranks cannot be searched");
  const auto start = std::chrono::steady_clock::now();
  const std::string run_path = (std::filesystem::path(o.run_dir) / format::run_file_name(-1, 1)).string();
  const format::RunData run = format::read_run(run_path);
  OfflineDoomSearch out;
  out.failing_step = failing_step_of(run, o.failing_step);
  const int64_t failing = out.failing_step;

  const at::Device device = select_device(o.device);
  configure_runtime(o, device);
  const std::vector<Fault> faults = faults_on_rank(o.faults, 0);
  const Dataset data = make_dataset(o);
  const BatchSampler sampler(data.size(), o.batch_size, o.shuffle, o.seed);
  log << "search-doom: step " << failing << " of " << run_path << ", budget " << o.doom_budget << " steps\n";

  for (const auto& [done, path] : checkpoints_before(o, failing)) {
    Replayable r = load_replayable(o, data, device, path, log);
    // The modules the run's fallback had moved to fp32 by then stay there.
    std::optional<Fp32ModuleRegions> fp32;
    if (!r.fp32_modules.empty()) fp32.emplace(*r.model, r.fp32_modules);
    log << "search-doom: from " << path << " (the state after step " << done - 1 << "), " << failing - done
        << " steps before step " << failing << "\n";
    AfterRunSteps steps(run, done, failing);
    steps.rebuild = [&](StepRecord& record) {
      record.batch_rows = sampler.rows(record.step);
      const auto [inputs, targets] = planted_batch(data, faults, record.step, record.batch_rows, device);
      MicroBatch micro;
      micro.batch = Batch(inputs, targets);
      record.micro_batches = {std::move(micro)};
      record.setup = planting(*r.model, model_fault_at(faults, record.step));
    };
    steps.budget = o.doom_budget - out.steps_run;
    steps.progress = [&](const std::string& line) { log << "search-doom: " << line << "\n"; };
    const AfterRunSearch found = search_after_run(*r.model, *r.optimizer, o.clip, o.rollback, steps);
    out.steps_run += found.steps_run;
    if (!found.reproduced)
      throw std::runtime_error("replayed from " + path + ", step " + std::to_string(failing) +
                               " does not fail again (or a step the run applied before it fails): the run cannot be "
                               "reproduced here (another machine, LibTorch or options?)" +
                               (found.error.empty() ? std::string() : "; a step raised: " + found.error));
    out.finding = found.finding;
    out.rows_text = found.rows_text;
    out.checkpoint = path;
    out.from_step = done - 1;
    // Already failing with every update since this checkpoint left out: an older one may reach the cause.
    if (out.finding.outcome != DoomOutcome::no_earlier_step) break;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int replays = out.finding.replays;
  out.text = doom_sentence(out.finding, failing, out.rows_text) + "; " + std::to_string(replays) +
             (replays == 1 ? " replay" : " replays") + " from " + out.checkpoint + " (the state after step " +
             std::to_string(out.from_step) + "), " + std::to_string(out.steps_run) + " steps run, " +
             seconds_text(out.seconds);
  return out;
}

}  // namespace nanscope::trainer
