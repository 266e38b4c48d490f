#include "nanscope/trainer/resume.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/format/error.hpp"

namespace nanscope::trainer {

std::string checkpoint_path_for_rank(const std::string& path, const DistOptions& d) {
  const auto at = path.find("{rank}");
  if (at != std::string::npos) return std::string(path).replace(at, 6, std::to_string(d.rank));
  return d.rank == 0 ? path : "";
}

namespace {

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
  group.all_reduce({gathered});
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
}  // namespace

void restore_optimizer_and_rng(const ResumeState& state, TrainableModel& model, torch::optim::Optimizer& optimizer) {
  load_optimizer_state_by_name(optimizer, model.trainable_parameters(), state.optimizer_state);
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  cpu.set_state(state.cpu_rng);
}

std::optional<Resumption> resumption(const TrainOptions& o, TrainableModel& model, ProcessGroup* group,
                                     at::Device device) {
  if (o.resume.empty()) return std::nullopt;
  Resumption r;
  const std::string current = checkpoint_path_for_rank(o.save, o.dist);
  if (group) {
    r.checkpoint = agreed_checkpoint(current, o, *group, device);
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

}  // namespace nanscope::trainer
