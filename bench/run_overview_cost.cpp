// What the run file's overview (format/run_overview.hpp) costs a clean step,
// against the step itself, in one process with the two interleaved round by
// round so they share the machine's state:
//   step       the benchmarks' small GPT, one training step (the baseline)
//   overview   the overview's work for one row of LAYERS layers (the
//              per-row fold nanscope's run writer does as it writes rows)
//   row        the run writer's whole cost for that row (rows, overview
//              blocks, the batched flush to disk)
// Prints the medians and each one's share of the step.
// Usage: run_overview_cost [ROUNDS=7] [STEPS_PER_ROUND=20] [LAYERS=256] [THREADS=2]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_args.hpp"
#include "bench_gpt.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_overview.hpp"
#include "nanscope/models/make_optimizer.hpp"

using namespace nanscope;
using namespace nanscope::trainer;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

format::StepRow row_for(int64_t step, size_t layers) {
  format::StepRow row;
  row.step = step;
  row.loss = 3.0 + std::sin(double(step));
  row.lr = 3e-4;
  row.loss_scale = 65536;
  row.grad_norm = 1.0 + 0.01 * double(step % 100);
  row.step_time = 0.002;
  for (size_t l = 0; l < layers; ++l) {
    row.layer_grad_norm.push_back(float(1e-3 * double(l + 1) * (1.5 + std::cos(double(step + l)))));
    row.layer_act_absmax.push_back(step % 10 == 0 ? float(l) : NAN);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "run_overview_cost [ROUNDS=7] [STEPS_PER_ROUND=20] [LAYERS=256] [THREADS=2]");
  const int rounds = int(args.count(1, 7));
  const int steps = int(args.count(2, 20));
  const size_t layers = size_t(args.count(3, 256));
  const int threads = int(args.count(4, 2));

  const GptConfig config = bench::gpt_config(threads);
  Dataset data = builtin_text_dataset(config.seq_len);
  auto model = make_gpt(config, 0);
  std::vector<at::Tensor> params;
  for (const auto& named : model->named_parameters()) params.push_back(named.second);
  auto optimizer = make_optimizer(OptimizerKind::adamw, params, 3e-4, 0.01);
  LossScaler scaler;
  BatchSampler sampler(data.size(), 16, false, 0);
  int64_t step = 0;
  auto gpt_step = [&] {
    at::Tensor rows = sampler.rows(step++);
    const auto start = Clock::now();
    train_step(*model, *optimizer, scaler, params, StepSettings{},
               Batch(data.inputs.index_select(0, rows), data.targets.index_select(0, rows)));
    return seconds_since(start);
  };

  // The rows go through a real writer (a file under /tmp) and, separately,
  // through the overview's builder alone; many rows per sample, so a flush
  // (every 64 rows) is counted at its share.
  const std::string dir = (std::filesystem::temp_directory_path() / "nanscope-bench-overview").string();
  std::filesystem::create_directories(dir);
  format::RunHeader header;
  for (size_t l = 0; l < layers; ++l) header.layer_names.push_back("layer" + std::to_string(l));
  header.record_act_absmax = true;
  format::RunWriter writer(dir + "/run.h5", header);
  format::OverviewBuilder builder(layers, true);
  constexpr int kRowsPerSample = 256;
  int64_t written = 0, folded = 0;
  std::vector<format::StepRow> rows;
  for (int i = 0; i < kRowsPerSample; ++i) rows.push_back(row_for(i, layers));
  format::RunData batch;  // the same rows as the writer holds them, for the builder
  batch.layer_names = header.layer_names;
  for (const auto& r : rows) {
    batch.step.push_back(r.step);
    batch.loss.push_back(r.loss);
    batch.lr.push_back(r.lr);
    batch.loss_scale.push_back(r.loss_scale);
    batch.grad_norm.push_back(r.grad_norm);
    batch.step_time.push_back(r.step_time);
    batch.skipped.push_back(0);
    batch.layer_grad_norm.insert(batch.layer_grad_norm.end(), r.layer_grad_norm.begin(), r.layer_grad_norm.end());
    batch.layer_act_absmax.insert(batch.layer_act_absmax.end(), r.layer_act_absmax.begin(), r.layer_act_absmax.end());
  }
  auto write_rows = [&] {
    const auto start = Clock::now();
    for (auto& r : rows) {
      r.step = written++;
      writer.append(r);
    }
    return seconds_since(start) / kRowsPerSample;
  };
  auto fold_rows = [&] {
    for (auto& s : batch.step) s = folded++;
    const auto start = Clock::now();
    builder.add(format::rows_view(batch, 0, batch.rows()));
    const double per_row = seconds_since(start) / kRowsPerSample;
    builder.take_completed();
    return per_row;
  };

  std::vector<double> step_times, overview_times, row_times;
  for (int i = 0; i < 3; ++i) gpt_step(), write_rows(), fold_rows();  // warm-up
  for (int r = 0; r < rounds; ++r)
    for (int s = 0; s < steps; ++s) {
      step_times.push_back(gpt_step());
      overview_times.push_back(fold_rows());
      row_times.push_back(write_rows());
    }
  std::filesystem::remove_all(dir);

  const double base = median(step_times);
  std::printf("run_overview_cost: gpt %lldx%lld step against one row of %zu layers, %d rounds x %d interleaved\n",
              static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd), layers, rounds, steps);
  std::printf("  step      median %9.3f ms\n", base * 1e3);
  std::printf("  overview  median %9.3f us per row  %.6f of the step (budget 0.01)\n", median(overview_times) * 1e6,
              median(overview_times) / base);
  std::printf("  row       median %9.3f us per row  %.6f of the step (the writer's whole cost, overview included)\n",
              median(row_times) * 1e6, median(row_times) / base);
  return 0;
}
