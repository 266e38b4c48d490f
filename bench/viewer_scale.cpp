// The viewer at scale: a run of 100,000 steps x 256 layers. Prints the time
// to open it (read + heatmap pyramids) and the CPU time of the model work a
// frame does while panning (decimating the plotted series, rebuilding the
// heatmap image), as medians. The GL/ImGui side of a frame is measured by
// nanscope-view itself (bench/viewer_scale.sh).
//   viewer_scale [RUN_FILE] [STEPS] [LAYERS]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/format/rehearsal.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/heatmap.hpp"
#include "nanscope/viewer/view_model.hpp"

using namespace nanscope;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void write_run(const std::string& path, int64_t steps, size_t layers) {
  format::RunHeader header;
  for (size_t l = 0; l < layers; ++l)
    header.layer_names.push_back("blocks." + std::to_string(l / 8) + ".layer" + std::to_string(l % 8));
  header.record_act_absmax = true;
  format::RunWriter writer(path, header, 4096);
  format::StepRow row;
  row.layer_grad_norm.resize(layers);
  row.layer_act_absmax.resize(layers);
  for (int64_t s = 0; s < steps; ++s) {
    row.step = s;
    row.loss = 4.0 * std::exp(-double(s) / 30000.0) + 0.05 * std::sin(double(s));
    row.lr = 1e-3;
    row.loss_scale = 65536;
    row.grad_norm = 1.0 + 0.1 * std::cos(double(s) / 100.0);
    for (size_t l = 0; l < layers; ++l) {
      row.layer_grad_norm[l] = float((l + 1) * 1e-3 * (1.0 + 0.5 * std::sin(double(s + l) / 50.0)));
      row.layer_act_absmax[l] = s % 100 == 0 ? float(l + 10) : NAN;
    }
    if (s == steps / 2) row.loss = NAN;
    writer.append(row);
    if (s == steps / 2) row.loss = 1.0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv,
                         "viewer_scale [RUN_FILE=/tmp/nanscope-viewer-scale.h5] [STEPS=100000] [LAYERS=256]");
  const std::string path = args.text(1, "/tmp/nanscope-viewer-scale.h5");
  const int64_t steps = args.count(2, 100000);
  const size_t layers = size_t(args.count(3, 256));
  if (!std::filesystem::exists(path)) {
    const auto start = Clock::now();
    write_run(path, steps, layers);
    std::printf("wrote %s: %lld steps x %zu layers, %.0f MB in %.1f s\n", path.c_str(), static_cast<long long>(steps),
                layers, double(std::filesystem::file_size(path)) / 1e6, ms_since(start) / 1000);
  }

  // Opening with and without the readers' rehearsal (the read done first in
  // a forked child, docs/format.md), interleaved so both see the same machine.
  std::vector<double> open_ms, unrehearsed_ms;
  for (int i = 0; i < 5; ++i) {
    for (bool rehearse : {true, false}) {
      format::set_rehearsal(rehearse);
      const auto start = Clock::now();
      viewer::ViewModel model;
      if (!model.open({path})) {
        std::fprintf(stderr, "viewer_scale: %s\n", model.errors().front().c_str());
        return 1;
      }
      (rehearse ? open_ms : unrehearsed_ms).push_back(ms_since(start));
    }
  }
  format::set_rehearsal(true);
  std::printf("open (read + pyramids), median of 5: %.0f ms; without the rehearsal %.0f ms (%.2fx)\n", median(open_ms),
              median(unrehearsed_ms), median(open_ms) / median(unrehearsed_ms));

  viewer::ViewModel model;
  model.open({path});
  const format::RunData& run = model.runs[0].data();
  // A 1600-px window: four half-width scalar plots, two layer plots and a
  // ~900-px heatmap; each pan moves the view, so the heatmap is rebuilt.
  constexpr size_t kPlotColumns = 480, kHeatmapColumns = 900;
  std::vector<std::vector<viewer::Column>> columns(6);
  viewer::HeatmapImage image;
  const auto& pyramid = model.runs[0].grad_norms();
  const viewer::LogScale scale = viewer::LogScale::spanning(pyramid.finite_min(), pyramid.finite_max());
  std::vector<double> frame_ms;
  for (const double span : {double(steps), double(steps) / 10, 2000.0}) {
    for (int pan = 0; pan < 40; ++pan) {
      const double x0 = (double(steps) - span) * pan / 39.0, x1 = x0 + span;
      const auto start = Clock::now();
      viewer::decimate(run.step.data(), viewer::series(run.loss), x0, x1, kPlotColumns, columns[0]);
      viewer::decimate(run.step.data(), viewer::series(run.loss_scale), x0, x1, kPlotColumns, columns[1]);
      viewer::decimate(run.step.data(), viewer::series(run.lr), x0, x1, kPlotColumns, columns[2]);
      viewer::decimate(run.step.data(), viewer::series(run.grad_norm), x0, x1, kPlotColumns, columns[3]);
      viewer::decimate(run.step.data(), viewer::layer_series(run.layer_grad_norm, layers, 7), x0, x1, kPlotColumns,
                       columns[4]);
      viewer::decimate(run.step.data(), viewer::layer_series(run.layer_act_absmax, layers, 7), x0, x1, kPlotColumns,
                       columns[5], {true, true});
      viewer::render_heatmap(pyramid, run.step.data(), x0, x1, kHeatmapColumns, scale, image);
      frame_ms.push_back(ms_since(start));
    }
  }
  std::printf("model work per panning frame (6 series + %zux%zu heatmap), %zu frames: median %.2f ms, p95 %.2f ms\n",
              kHeatmapColumns, layers, frame_ms.size(), median(frame_ms), percentile(frame_ms, 0.95));
  return 0;
}
