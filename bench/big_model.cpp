// Snapshots and checkpoints of a model of about 100M parameters (the built-in
// gpt, widened): for each, the wall time, the peak memory it adds on top of
// the process (VmHWM after resetting it, minus the resident size before), and
// the file size, against the model's own size (its fp32 weights).
// Usage: big_model [N_LAYER=14] [N_EMBD=768] [DIR=/tmp]
#include <torch/optim/adamw.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/make_optimizer.hpp"
#include "nanscope/probe/snapshot.hpp"
#include "nanscope/trainer/setup.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

namespace {

// Resident and peak resident memory (kB) from /proc/self/status.
long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field));
  return -1;
}
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Cost {
  double seconds, extra_mb, file_mb;
};
template <typename Write>
Cost measure(const std::string& file, Write write) {
  std::filesystem::remove(file);
  reset_peak();
  const long before = status_kb("VmRSS:");
  const auto start = std::chrono::steady_clock::now();
  write();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds, (status_kb("VmHWM:") - before) / 1024.0, std::filesystem::file_size(file) / 1048576.0};
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "big_model [N_LAYER=14] [N_EMBD=768] [DIR=/tmp]");
  TrainOptions runtime;
  runtime.threads = 2;
  configure_runtime(runtime, at::kCPU);
  GptConfig config;
  config.n_layer = args.count(1, 14);
  config.n_embd = args.count(2, 768);
  config.n_head = 12;
  config.seq_len = 32;
  const std::string dir = args.text(3, "/tmp");
  if (config.n_embd % config.n_head != 0) args.fail("N_EMBD must be a multiple of the 12 heads");
  auto model = make_gpt(config, 0);
  const std::vector<at::Tensor> params = trainable_tensors(*model);
  auto optimizer = make_optimizer(OptimizerKind::adamw, params, 1e-4, 0.01);
  LossScaler scaler;
  const at::Tensor x = at::randint(0, 256, {2, config.seq_len}), y = at::randint(0, 256, {2, config.seq_len});
  train_step(*model, *optimizer, scaler, params, StepSettings{}, Batch(x, y));  // the optimizer state exists
  double model_mb = 0;
  for (const auto& p : params) model_mb += p.numel() * p.element_size() / 1048576.0;

  const std::string checkpoint = dir + "/nanscope-big-checkpoint.h5", snapshot = dir + "/nanscope-big-snapshot.h5";
  const Cost weights = measure(checkpoint, [&] { save_checkpoint(checkpoint, *model, 1); });
  const ResumeState resume{optimizer_state_by_name(*optimizer, model->trainable_parameters()),
                           at::detail::getDefaultCPUGenerator().get_state(),
                           {}};
  const Cost resumable = measure(checkpoint, [&] { save_checkpoint(checkpoint, *model, 1, &resume); });
  probe::SnapshotContents s;
  s.step = 1;
  s.model_name = "gpt";
  s.model_hparams = model->spec().hparams;
  s.parameters = model->named_parameters();
  s.buffers = model->named_buffers();
  s.optimizer = "adamw";
  s.optimizer_state = optimizer_state_by_name(*optimizer, s.parameters);
  s.batch = Batch(x, y);
  s.batch_rows = at::arange(2, at::kLong);
  s.cpu_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  s.precision = format::Precision::bf16;
  const Cost snap = measure(snapshot, [&] { probe::write_snapshot(snapshot, s); });
  std::printf("big_model: gpt %lldx%lld, %lld parameters, weights %.0f MB (fp32), LibTorch %s, files in %s\n",
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
              static_cast<long long>(model->parameter_count()), model_mb, TORCH_VERSION, dir.c_str());
  for (const auto& [name, c] : {std::pair<const char*, Cost>{"checkpoint (weights)", weights},
                                {"checkpoint (+ resume state)", resumable},
                                {"snapshot (+ AdamW state, batch)", snap}})
    std::printf("  %-32s %6.2f s  %7.0f MB file (%4.0f MB/s)  peak extra memory %6.0f MB = %.2fx the model\n", name,
                c.seconds, c.file_mb, c.file_mb / c.seconds, c.extra_mb, c.extra_mb / model_mb);
  // Reading it back: the summary every tool reads first (rehearsed in a forked
  // child first: format/src/rehearsal.hpp), and the whole snapshot (replay).
  std::vector<double> summary_times, archive_times;
  for (int i = 0; i < 5; ++i) {
    auto start = std::chrono::steady_clock::now();
    format::read_snapshot_summary(snapshot);
    summary_times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    start = std::chrono::steady_clock::now();
    format::Archive::open(snapshot, format::kSnapshotFileKind).close();
    archive_times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const auto start = std::chrono::steady_clock::now();
  const probe::SnapshotContents back = probe::read_snapshot(snapshot);
  const double whole = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "  reading it: summary %.1f ms, opening the archive %.1f ms (medians of 5, each with its rehearsal in a "
      "child), the whole snapshot %.2f s\n",
      median(summary_times) * 1e3, median(archive_times) * 1e3, whole);
  std::filesystem::remove(checkpoint);
  std::filesystem::remove(snapshot);
  return 0;
}
