// Probe cost on a small GPT, measured in one process with the modes
// interleaved (plain and probe step by step, the costly modes round by round)
// so they share the machine's state and noise:
//   plain    the stock step (what --probe off runs)
//   probe    + RNG state copy, device-side batch check, per-parameter norms
//            folded into per-layer norms (what --probe on adds to a clean step)
//   capture  op-level capture on every step (--capture every-step)
//   anomaly  torch::autograd::DetectAnomalyGuard around the step (LibTorch's own)
// Prints the median step time of each and its ratio to plain.
// Usage: probe_overhead [ROUNDS=7] [STEPS_PER_ROUND=20] [THREADS=2]
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "bench_gpt.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/make_optimizer.hpp"
#include "nanscope/probe/op_capture.hpp"
#include "nanscope/probe/probe.hpp"
#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/setup.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "probe_overhead [ROUNDS=7] [STEPS_PER_ROUND=20] [THREADS=2]");
  const int rounds = int(args.count(1, 7));
  const int steps = int(args.count(2, 20));
  const int threads = int(args.count(3, 2));
  const GptConfig config = bench::gpt_config(threads);
  Dataset data = builtin_text_dataset(config.seq_len);
  auto model = make_gpt(config, 0);
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, p] : model->named_parameters()) {
    params.push_back(p);
    names.push_back(name);
  }
  auto optimizer = make_optimizer(OptimizerKind::adamw, params, 3e-4, 0.01);
  LossScaler scaler;
  probe::Probe probe({"/tmp/nanscope-bench-unused", {}}, names);
  BatchSampler sampler(data.size(), 16, false, 0);
  int64_t step = 0;

  struct Mode {
    const char* name;
    int steps_per_round;
    std::function<double()> run_step;  // seconds
    std::vector<double> times;
  };
  auto timed = [&](bool with_probe, bool capture, bool anomaly) {
    at::Tensor rows = sampler.rows(step++);
    at::Tensor inputs = data.inputs.index_select(0, rows), targets = data.targets.index_select(0, rows);
    const auto start = std::chrono::steady_clock::now();
    StepSettings settings;
    settings.parameter_norms = with_probe;
    if (with_probe) probe.begin_step(step, rows);
    std::optional<probe::OpCapture> op_capture;
    if (capture) op_capture.emplace();
    std::optional<torch::autograd::DetectAnomalyGuard> anomaly_guard;
    if (anomaly) anomaly_guard.emplace();
    StepOutcome out = train_step(*model, *optimizer, scaler, params, settings, Batch(inputs, targets));
    if (with_probe) probe.layer_grad_norms(out.parameter_norms);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<Mode> modes{
      {"plain", steps, [&] { return timed(false, false, false); }, {}},
      {"probe", steps, [&] { return timed(true, false, false); }, {}},
      {"capture", std::max(2, steps / 10), [&] { return timed(true, true, false); }, {}},
      {"anomaly", std::max(2, steps / 4), [&] { return timed(false, false, true); }, {}},
  };
  for (int i = 0; i < 3; ++i) timed(false, false, false);  // warm-up: allocator, thread pool
  for (int r = 0; r < rounds; ++r) {
    // plain and probe alternate step by step: the ratio that matters most
    // sees the same machine state on both sides.
    for (int s = 0; s < steps; ++s) {
      modes[0].times.push_back(modes[0].run_step());
      modes[1].times.push_back(modes[1].run_step());
    }
    for (size_t m = 2; m < modes.size(); ++m)
      for (int s = 0; s < modes[m].steps_per_round; ++s) modes[m].times.push_back(modes[m].run_step());
  }

  const double plain = median(modes[0].times);
  std::printf("probe_overhead: gpt %lldx%lld, batch 16x%lld, %d threads, %d rounds interleaved (LibTorch %s)\n",
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
              static_cast<long long>(config.seq_len), threads, rounds, TORCH_VERSION);
  for (const auto& mode : modes)
    std::printf("  %-8s median step %8.3f ms  (%3zu steps)  ratio to plain %.3f\n", mode.name, median(mode.times) * 1e3,
                mode.times.size(), median(mode.times) / plain);
  return 0;
}
