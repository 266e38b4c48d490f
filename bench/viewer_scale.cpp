// The viewer at scale: a run of STEPS steps x 256 layers (bench/viewer_scale.sh
// runs 100,000 and 1,000,000). Prints the time to open it (read + heatmap
// pyramids, with and without the crash rehearsal), the memory it holds, and
// the CPU time of the model work a frame does while panning and zooming
// (decimating the plotted series, rebuilding the heatmap image, taking in a
// zoomed-in window of rows), as medians, each against its budget. The
// GL/ImGui side of a frame is measured by nanscope-view itself.
//   viewer_scale [RUN_FILE] [STEPS] [LAYERS]
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
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

// A field of /proc/self/status in MiB ("VmRSS", "VmHWM").
double status_mib(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kib = 0;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') kib = std::atof(line + n + 1);
  std::fclose(f);
  return kib / 1024;
}
double resident_mib() { return status_mib("VmRSS"); }
double peak_mib() { return status_mib("VmHWM"); }

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
    if (s == steps / 2) row.loss = row.layer_grad_norm[3] = NAN;  // the one bad step
    writer.append(row);
  }
}

// A run written at 1,000 steps per second after `head` steps written at
// once (the bench's length: a long run), followed as nanscope-view follows
// it: a poll every half second (its default --poll). Prints what a poll
// costs the frame it falls in, and how far the view is behind the rows the
// writer has published.
void follow_live_run(const std::string& path, size_t layers, int64_t head) {
  const int64_t kHead = std::max<int64_t>(head, int64_t(viewer::kLongRunRows) + 1);
  constexpr int64_t kPerSecond = 1000, kSeconds = 6;
  // The writer's published rows, shared with this process.
  auto* published = static_cast<std::atomic<int64_t>*>(
      mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (published) std::atomic<int64_t>(0);
  int go[2];
  if (pipe(go) != 0) return;
  const pid_t writer_pid = fork();
  if (writer_pid == 0) {
    format::RunHeader header;
    for (size_t l = 0; l < layers; ++l) header.layer_names.push_back("layer" + std::to_string(l));
    header.record_act_absmax = true;
    format::RunWriter writer(path, header);  // flushes every 64 rows, as nanscope-train's does
    format::StepRow row;
    row.layer_grad_norm.assign(layers, 0.5f);
    row.layer_act_absmax.assign(layers, NAN);
    auto append = [&](int64_t s) {
      row.step = s;
      row.loss = 2.0 + std::sin(double(s));
      row.lr = 1e-3;
      row.grad_norm = 1.0;
      writer.append(row);
      if ((s + 1) % int64_t(format::RunWriter::kRowsPerBatch) == 0) published->store(s + 1);
    };
    for (int64_t s = 0; s < kHead; ++s) append(s);
    writer.flush();
    published->store(kHead);
    char c;
    (void)!read(go[0], &c, 1);
    const auto start = Clock::now();
    for (int64_t s = kHead; s < kHead + kPerSecond * kSeconds; ++s) {
      std::this_thread::sleep_until(start + std::chrono::microseconds((s - kHead) * 1000000 / kPerSecond));
      append(s);
    }
    _exit(0);
  }
  while (published->load() < kHead) {
    if (waitpid(writer_pid, nullptr, WNOHANG) == writer_pid) {
      std::fprintf(stderr, "viewer_scale: the live run's writer died\n");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  viewer::ViewModel model;
  model.open({path});
  if (write(go[1], "g", 1) != 1) return;
  std::vector<double> poll_ms, behind;
  const auto start = Clock::now();
  while (ms_since(start) < 1000.0 * (kSeconds - 0.5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const int64_t written = published->load();
    const auto poll_start = Clock::now();
    model.poll();
    poll_ms.push_back(ms_since(poll_start));
    behind.push_back(double(written - int64_t(model.runs[0].data().rows())));
  }
  waitpid(writer_pid, nullptr, 0);
  std::printf(
      "live: a run of %lld steps writing %lld more per second x %zu layers, polled every 0.5 s for %lld s: a poll "
      "costs median "
      "%.1f ms, max %.1f ms (budget 16: one frame); rows behind the writer after a poll: max %.0f (budget 64: one "
      "batch the writer publishes)%s\n",
      static_cast<long long>(kHead), static_cast<long long>(kPerSecond), layers, static_cast<long long>(kSeconds),
      median(poll_ms), *std::max_element(poll_ms.begin(), poll_ms.end()),
      *std::max_element(behind.begin(), behind.end()), model.runs[0].is_long() ? "" : " (not read as a long run!)");
  std::filesystem::remove(path);
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
  std::printf(
      "open (read + pyramids), median of 5: %.0f ms (budget 1000 ms to the first frame: see nanscope-view below);"
      " without the rehearsal %.0f ms (the rehearsal costs %.2fx the read it protects, budget 1x)\n",
      median(open_ms), median(unrehearsed_ms), median(open_ms) / median(unrehearsed_ms) - 1);

  viewer::ViewModel model;
  model.open({path});
  const viewer::RunSource& source = model.runs[0];
  const format::RunData& run = source.data();
  std::printf("memory after open: %.0f MiB resident (budget 512 MiB); %s\n", resident_mib(),
              source.is_long() ? "a long run: read through its overview" : "a short run: every row in memory");
  // A 1600-px window: four half-width scalar plots, two layer plots and a
  // ~900-px heatmap; each pan moves the view, so every series is decimated
  // and the heatmap rebuilt. A zoomed-in view asks for its rows, fetched
  // behind the frames and taken in by the next frame's poll.
  constexpr size_t kPlotColumns = 480, kHeatmapColumns = 900;
  std::vector<std::vector<viewer::Column>> columns(6);
  viewer::HeatmapImage image;
  const viewer::LogScale scale = viewer::LogScale::spanning(source.grad_norm_min(), source.grad_norm_max());
  using format::OverviewScalar;
  using viewer::OverviewTable;
  auto scalar = [&](const std::vector<double>& values, OverviewScalar which, double x0, double x1,
                    std::vector<viewer::Column>& out) {
    viewer::decimate_series(run.step.data(), viewer::series(values), source.scalar_blocks(which), x0, x1, kPlotColumns,
                            out);
  };
  auto layer = [&](OverviewTable table, double x0, double x1, std::vector<viewer::Column>& out, bool act) {
    viewer::DecimateOptions options;
    options.nan_is_missing = act;
    options.log_y = act;
    viewer::decimate_series(source.layer_row_steps(), source.layer_rows(table, 7), source.layer_blocks(table, 7), x0,
                            x1, kPlotColumns, out, options);
  };
  std::vector<double> frame_ms;
  const double steps_d = double(steps);
  for (const double span : {steps_d, steps_d / 10, steps_d / 1000, 2000.0}) {
    for (int pan = 0; pan < 40; ++pan) {
      const double x0 = (steps_d - span) * pan / 39.0, x1 = x0 + span;
      const auto start = Clock::now();
      model.poll();
      model.focus({x0, x1}, kHeatmapColumns);
      scalar(run.loss, OverviewScalar::loss, x0, x1, columns[0]);
      scalar(run.loss_scale, OverviewScalar::loss_scale, x0, x1, columns[1]);
      scalar(run.lr, OverviewScalar::lr, x0, x1, columns[2]);
      scalar(run.grad_norm, OverviewScalar::grad_norm, x0, x1, columns[3]);
      layer(OverviewTable::layer_grad_norm, x0, x1, columns[4], false);
      layer(OverviewTable::layer_act_absmax, x0, x1, columns[5], true);
      viewer::render_heatmap(source.grad_norm_grid({x0, x1}, kHeatmapColumns), x0, x1, kHeatmapColumns, scale, image);
      frame_ms.push_back(ms_since(start));
    }
  }
  std::printf(
      "model work per panning frame (6 series + %zux%zu heatmap), %zu frames over 4 zooms: median %.2f ms "
      "(budget 8), p95 %.2f ms (budget 16)\n",
      kHeatmapColumns, layers, frame_ms.size(), median(frame_ms), percentile(frame_ms, 0.95));
  std::printf("memory at the end: %.0f MiB resident, peak %.0f MiB (budget 512 MiB)\n", resident_mib(), peak_mib());
  follow_live_run(path + ".live.h5", layers, steps);
  return 0;
}
