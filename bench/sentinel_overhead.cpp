// What early warnings and rollback cost on the built-in gpt, in one process
// with the two modes interleaved step by step (two identical models, one
// guard each), so they share the machine's state and noise:
//   off   --warn off --rollback off: the stock guarded step
//   on    --warn on  --rollback on (a state saved every 25 steps)
// Then the state ring itself: the bytes one saved state holds (weights,
// buffers, AdamW state), the time to save one and to restore one, and the
// time nanscope-train takes to come back from a checkpoint in a new process
// (start, load, first step): what a restart costs before it redoes any step.
// Usage: sentinel_overhead NANSCOPE_TRAIN [ROUNDS=7] [STEPS_PER_ROUND=50] [THREADS=2]
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_gpt.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/state_ring.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/make_optimizer.hpp"
#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/setup.hpp"

using namespace nanscope;
using namespace nanscope::trainer;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Arm {
  std::unique_ptr<TrainableModel> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<StepGuard> guard;
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "sentinel_overhead NANSCOPE_TRAIN [ROUNDS=7] [STEPS_PER_ROUND=50] [THREADS=2]");
  const std::string train_exe = args.required(1);
  const int rounds = int(args.count(2, 7));
  const int steps = int(args.count(3, 50));
  const int threads = int(args.count(4, 2));
  const GptConfig config = bench::gpt_config(threads);
  Dataset data = builtin_text_dataset(config.seq_len);
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "nanscope-bench-sentinel";
  std::filesystem::remove_all(tmp);

  Arm arms[2];
  for (int a = 0; a < 2; ++a) {
    arms[a].model = make_gpt(config, 0);
    arms[a].optimizer = make_optimizer(OptimizerKind::adamw, trainable_tensors(*arms[a].model), 3e-4, 0.01);
    GuardOptions g;
    g.run_dir = (tmp / (a == 0 ? "off" : "on")).string();
    g.warn = a == 1;
    g.rollback.enabled = a == 1;
    g.optimizer_name = "adamw";
    arms[a].guard = std::make_unique<StepGuard>(*arms[a].model, *arms[a].optimizer, g);
  }
  BatchSampler sampler(data.size(), 16, false, 0);
  int64_t step = 0;
  for (int r = 0; r < rounds; ++r)
    for (int s = 0; s < steps; ++s, ++step) {
      const at::Tensor rows = sampler.rows(step);
      const at::Tensor x = data.inputs.index_select(0, rows), y = data.targets.index_select(0, rows);
      for (Arm& arm : arms) {
        const auto start = Clock::now();
        arm.guard->closure_step(x, y, nanscope::StepContext::numbered(step));
        arm.times.push_back(seconds_since(start));
      }
    }
  const double off = median(arms[0].times), on = median(arms[1].times);

  // The ring on its own: one state's bytes, save and restore times.
  Arm& arm = arms[1];
  StateRing ring(1, size_t(1) << 34);
  LossScaler scaler;
  std::vector<double> saves, restores;
  for (int i = 0; i < 7; ++i) {
    auto start = Clock::now();
    ring.save(i, *arm.model, *arm.optimizer, scaler);
    saves.push_back(seconds_since(start));
    start = Clock::now();
    StateRing::restore(*ring.newest_before(i + 1), *arm.model, *arm.optimizer, scaler);
    restores.push_back(seconds_since(start));
  }
  size_t weight_bytes = 0;
  for (const auto& [name, p] : arm.model->named_parameters()) weight_bytes += p.numel() * p.element_size();

  // A restart: a new process that loads the checkpoint and runs one step.
  const std::string checkpoint = (tmp / "ckpt.h5").string();
  save_checkpoint(checkpoint, *arm.model, step);
  std::vector<double> restarts;
  const std::string command = train_exe + " --model gpt --n-layer 4 --n-head 4 --n-embd 128 --seq-len 64 " +
                              "--batch-size 16 --steps 1 --quiet --threads " + std::to_string(threads) + " --init " +
                              checkpoint + " --run-dir " + (tmp / "restart").string() + " >/dev/null 2>&1";
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "sentinel_overhead: the restart command failed: %s\n", command.c_str());
      return 1;
    }
    restarts.push_back(seconds_since(start));
  }

  std::printf(
      "sentinel_overhead: gpt %lldx%lld (%lld parameters), batch 16x%lld, %d threads, %d rounds x %d steps "
      "interleaved (LibTorch %s)\n",
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
      static_cast<long long>(arm.model->parameter_count()), static_cast<long long>(config.seq_len), threads, rounds,
      steps, TORCH_VERSION);
  std::printf("  warn+rollback off  median step %8.3f ms (p25 %.3f, p75 %.3f)\n", off * 1e3,
              percentile(arms[0].times, 0.25) * 1e3, percentile(arms[0].times, 0.75) * 1e3);
  std::printf("  warn+rollback on   median step %8.3f ms (p25 %.3f, p75 %.3f)  ratio to off %.3f\n", on * 1e3,
              percentile(arms[1].times, 0.25) * 1e3, percentile(arms[1].times, 0.75) * 1e3, on / off);
  std::printf("  ring: one state %.2f MB (weights %.2f MB), %zu states by default = %.2f MB\n", ring.bytes() / 1e6,
              weight_bytes / 1e6, size_t(RollbackOptions{}.states), RollbackOptions{}.states * ring.bytes() / 1e6);
  std::printf("  save a state   median %8.3f ms (every 25 steps: %.2f%% of a step each step)\n", median(saves) * 1e3,
              100.0 * median(saves) / 25 / on);
  std::printf("  rollback (restore a state) median %8.3f ms\n", median(restores) * 1e3);
  std::printf("  restart from a checkpoint (new process, load, 1 step) median %8.3f ms: %.0fx the rollback\n",
              median(restarts) * 1e3, median(restarts) / median(restores));
  std::filesystem::remove_all(tmp);
  return 0;
}
