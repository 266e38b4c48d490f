// nanscope-view in a real window under Xvfb: the screenshots' pixels show the
// plots, the heatmap and the snapshot, and bad inputs are reported, not fatal.
#include <gtest/gtest.h>
#include <stb/stb_image.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "../support/test_support.hpp"

#include "nanscope/format/precision_trail.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/viewer/colormap.hpp"
#include "synthetic_files.hpp"

using namespace nanscope;

namespace {

const std::string kView = test::paths::view_exe;
const std::string kXvfbRun = test::paths::xvfb_run;

struct Rgb {
  int r, g, b;
};

Rgb rgb_of(uint32_t packed) { return {int(packed & 255), int(packed >> 8 & 255), int(packed >> 16 & 255)}; }

int distance(Rgb a, Rgb b) { return std::abs(a.r - b.r) + std::abs(a.g - b.g) + std::abs(a.b - b.b); }

struct Region {
  int x = 0, y = 0, w = 0, h = 0;
};

class Screenshot {
 public:
  Screenshot(const std::string& png, const std::string& output) {
    int channels = 0;
    pixels_.reset(stbi_load(png.c_str(), &width_, &height_, &channels, 3));
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream in(line);
      std::string word, name;
      Region r;
      if (in >> word >> name >> r.x >> r.y >> r.w >> r.h && word == "region") regions_[name] = r;
    }
  }
  bool loaded() const { return pixels_ != nullptr; }
  bool has(const std::string& region) const { return regions_.count(region) > 0; }
  Region region(const std::string& name) const { return regions_.at(name); }
  Rgb at(int x, int y) const {
    const unsigned char* p = pixels_.get() + (size_t(y) * width_ + x) * 3;
    return {p[0], p[1], p[2]};
  }
  // Pixels of `region` within `tolerance` (sum of channel differences) of `color`.
  int count(const Region& r, Rgb color, int tolerance = 40) const {
    int n = 0;
    for_each(r, [&](Rgb p) { n += distance(p, color) <= tolerance; });
    return n;
  }
  template <typename Fn>
  void for_each(const Region& r, Fn fn) const {
    for (int y = std::max(0, r.y); y < std::min(height_, r.y + r.h); ++y)
      for (int x = std::max(0, r.x); x < std::min(width_, r.x + r.w); ++x) fn(at(x, y));
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { stbi_image_free(p); }
  };
  std::unique_ptr<unsigned char, Free> pixels_;
  int width_ = 0, height_ = 0;
  std::map<std::string, Region> regions_;
};

// Runs nanscope-view on `inputs` under Xvfb and returns its exit code and output.
// -noreset: an X server resets when its last client leaves and then sends
// SIGUSR1 to xvfb-run, which by then is in its EXIT trap removing its temporary
// directory. dash (0.5.12) lets a trapped signal there turn that rm's status
// into the exit status pending, so a viewer that exits non-zero (2: a bad
// input) made xvfb-run exit 5, "problem while cleaning up temporary directory",
// whenever the signal landed during the rm. Without a reset there is no signal.
test::CommandResult view(const std::string& inputs, const std::string& png, const std::string& extra = "") {
  return test::run_command(kXvfbRun + " -a -s '-screen 0 1600x1000x24 -noreset' " + kView + " " + inputs +
                           " --screenshot " + png + " --frames 4 " + extra);
}

// A run of 100 steps shown: the screenshot, its loss plot, and where a step is on it.
struct LossPlot {
  test::CommandResult viewer;
  Screenshot shot;
  Region loss{};
  bool shown() const { return viewer.exit_code == 0 && shot.loaded() && shot.has("plot.loss"); }
  int x_of(double step) const { return loss.x + int(step / 100.0 * loss.w); }
};
LossPlot show_loss_plot(const std::string& run, const std::string& png) {
  test::CommandResult r = view(run, png);
  Screenshot shot(png, r.output);
  const Region loss = shot.has("plot.loss") ? shot.region("plot.loss") : Region{};
  return {std::move(r), std::move(shot), loss};
}

// How much of a region is drawn in the heatmap's colour map.
double colormap_share(const Screenshot& shot, const Region& r, std::set<int>* distinct) {
  std::vector<Rgb> map;
  for (int i = 0; i <= 64; ++i) map.push_back(rgb_of(viewer::colormap(float(i) / 64)));
  int on_map = 0, total = 0;
  shot.for_each(r, [&](Rgb p) {
    ++total;
    for (const Rgb& m : map)
      if (distance(p, m) <= 24) {
        ++on_map;
        if (distinct) distinct->insert(p.r << 16 | p.g << 8 | p.b);
        break;
      }
  });
  return total ? double(on_map) / total : 0;
}

class ViewerScreenshot : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kXvfbRun.empty()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  }
};

const Rgb kRunColor = rgb_of(viewer::rgba(80, 160, 255));
const Rgb kNaN = rgb_of(viewer::kNaNColor);

}  // namespace

// The bundled fine-tune with its planted fault (log of a GELU output at step
// 40), replayed, then shown: the sample run a user would look at.
TEST_F(ViewerScreenshot, SampleRunShowsLossCurveNaNMarkerAndHeatmap) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  auto train = test::run_command(std::string(test::paths::train_exe) + " --config " + test::paths::samples +
                                 "/configs/gpt-finetune-fault.toml --steps 60 --act-absmax-every 5 --run-dir " + run);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  auto r = view(run, dir.file("run.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("run.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("plot.loss") && shot.has("heatmap") && shot.has("plot.act_absmax")) << r.output;

  // The loss curve is drawn in the run's colour, and step 40's NaN is marked.
  const Region loss = shot.region("plot.loss");
  EXPECT_GT(shot.count(loss, kRunColor), loss.w / 2) << r.output;
  EXPECT_GT(shot.count({loss.x, loss.y, loss.w, 8}, kNaN, 10), 5);
  // The NaN marker sits at step 40 of 60 (the plot spans steps 0-60).
  const int nan_x = loss.x + int(40.5 / 60.0 * loss.w);
  EXPECT_GT(shot.count({nan_x - 6, loss.y, 12, 8}, kNaN, 10), 5);

  // The heatmap is the colour map almost everywhere, many shades of it, with
  // the NaN step a column in the NaN colour through every layer.
  const Region heat = shot.region("heatmap");
  std::set<int> distinct;
  EXPECT_GT(colormap_share(shot, heat, &distinct), 0.85);
  EXPECT_GT(distinct.size(), 40u);
  const int column = heat.x + int(40.5 / 60.0 * heat.w);
  EXPECT_GT(shot.count({column - 2, heat.y, 5, heat.h}, kNaN, 10), heat.h);

  // The activation plot draws the fp16 limit as a headroom line.
  EXPECT_GT(shot.count(shot.region("plot.act_absmax"), rgb_of(viewer::rgba(255, 120, 40)), 30), 100);

  // A bf16 run (then fp32 after its fallback) has no loss scaler: no flat line at 1, a note instead.
  EXPECT_FALSE(shot.has("plot.loss_scale")) << r.output;
  EXPECT_TRUE(shot.has("note.loss_scale")) << r.output;
}

// A million steps, one of them NaN: at the whole-run zoom the heatmap shows
// it in its layer's row (and nowhere else) and the loss curve marks it, read
// through the run's overview (a 64-step block can fill a pixel column, never
// be sampled away).
TEST_F(ViewerScreenshot, ASingleNaNStepInAMillionStepRunShowsAtTheWholeRunZoom) {
  test::TempDir dir;
  const std::string run = dir.file("run.h5");
  constexpr int64_t kSteps = 1000000, kNaNStep = 654321;
  constexpr int kLayers = 8, kNaNLayer = 2;  // synthetic_row's NaN layer
  test::write_long_synthetic_run(run, kSteps, kLayers, kNaNStep);
  auto r = view(run, dir.file("run.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("run.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("plot.loss") && shot.has("heatmap")) << r.output;
  const double at = (double(kNaNStep) + 0.5) / double(kSteps);

  const Region loss = shot.region("plot.loss");
  const int nan_x = loss.x + int(at * loss.w);
  EXPECT_GT(shot.count({nan_x - 6, loss.y, 12, 8}, kNaN, 10), 5) << "the marker at step 654321";
  EXPECT_EQ(shot.count({loss.x, loss.y, nan_x - 8 - loss.x, loss.h}, kNaN, 10), 0) << "no marker before it";
  EXPECT_EQ(shot.count({nan_x + 8, loss.y, loss.x + loss.w - nan_x - 8, loss.h}, kNaN, 10), 0) << "nor after";

  // The heatmap: the colour map, and the NaN cell in layer 2's band only.
  const Region heat = shot.region("heatmap");
  EXPECT_GT(colormap_share(shot, heat, nullptr), 0.85);
  const double row_height = double(heat.h) / kLayers;
  const int column = heat.x + int(at * heat.w), top = heat.y + int(kNaNLayer * row_height);
  const Region inside{column - 2, top + 2, 5, int(row_height) - 4}, around{column - 2, top - 1, 5, int(row_height) + 3};
  EXPECT_GE(shot.count(inside, kNaN, 10), inside.h) << "a column of NaN pixels in layer 2's row";
  EXPECT_EQ(shot.count(heat, kNaN, 10), shot.count(around, kNaN, 10)) << "and no NaN pixel anywhere else";
}

// Only fp16 has a loss scaler (playbook P5, P6). Overlaid with a bf16 run, the
// loss-scale plot draws the fp16 run alone; a bf16 run by itself gets a note
// ("no scaler") where a flat line at 1 would read like a scaler stuck at 1.
TEST_F(ViewerScreenshot, TheLossScalePlotShowsOnlyRunsWithAScaler) {
  test::TempDir dir;
  test::write_synthetic_run(dir.file("fp16.h5"), 100, 3, -1, format::Precision::fp16);
  test::write_synthetic_run(dir.file("bf16.h5"), 100, 3, -1, format::Precision::bf16);
  const Rgb second_run = rgb_of(viewer::rgba(250, 170, 40));
  auto both = view(dir.file("fp16.h5") + " " + dir.file("bf16.h5"), dir.file("both.png"));
  ASSERT_EQ(both.exit_code, 0) << both.output;
  Screenshot shot(dir.file("both.png"), both.output);
  ASSERT_TRUE(shot.loaded() && shot.has("plot.loss_scale") && shot.has("plot.loss")) << both.output;
  const Region scale = shot.region("plot.loss_scale"), loss = shot.region("plot.loss");
  EXPECT_GT(shot.count(scale, kRunColor), scale.w / 2) << "the fp16 run's scale";
  EXPECT_EQ(shot.count(scale, second_run, 30), 0) << "a line for the bf16 run";
  EXPECT_GT(shot.count(loss, second_run, 30), loss.w / 2) << "the bf16 run is shown elsewhere";

  auto alone = view(dir.file("bf16.h5"), dir.file("bf16.png"));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  Screenshot bf16(dir.file("bf16.png"), alone.output);
  ASSERT_TRUE(bf16.loaded());
  EXPECT_FALSE(bf16.has("plot.loss_scale")) << alone.output;
  ASSERT_TRUE(bf16.has("note.loss_scale")) << alone.output;
  EXPECT_EQ(bf16.count(bf16.region("note.loss_scale"), kRunColor), 0) << "a line drawn under the note";
  EXPECT_GT(bf16.count(bf16.region("plot.loss"), kRunColor), loss.w / 2);
}

// A run that warned and rolled back: the markers on the step axis in their
// colours, the rolled-back steps a grey band, the loss axis fitted to the
// curve that counts (the burst's 1e6 rows are not on it).
TEST_F(ViewerScreenshot, WarningAndRollbackAreMarkedAndTheRolledBackStepsGreyedOut) {
  test::TempDir dir;
  test::write_synthetic_rollback_run(dir.file("run.h5"), 100, 3);
  const LossPlot plot = show_loss_plot(dir.file("run.h5"), dir.file("run.png"));
  ASSERT_TRUE(plot.shown()) << plot.viewer.output;
  const Screenshot& shot = plot.shot;
  const Region loss = plot.loss;
  const auto x_of = [&](double step) { return plot.x_of(step); };
  EXPECT_GT(shot.count({x_of(40.5) - 5, loss.y, 10, loss.h}, rgb_of(viewer::rgba(255, 225, 80)), 30), 10)
      << "the warning's marker at step 40";
  EXPECT_GT(shot.count({x_of(60.5) - 5, loss.y, 10, loss.h}, rgb_of(viewer::rgba(90, 230, 200)), 30), 10)
      << "the rollback's marker at step 60";
  // The band: the plot's background under a grey veil, between steps 41 and 61.
  const Rgb veiled{47, 49, 54};
  const Region band{x_of(44), loss.y, x_of(58) - x_of(44), loss.h};
  EXPECT_GT(shot.count(band, veiled, 12), band.w * band.h / 2);
  EXPECT_LT(shot.count({x_of(10), loss.y, x_of(30) - x_of(10), loss.h}, veiled, 12), 20) << "no veil elsewhere";
  // Fitted to the losses that count (0.1-5): the curve fills the plot's height, not its bottom edge.
  int top = loss.y + loss.h, bottom = loss.y;
  for (int y = loss.y; y < loss.y + loss.h; ++y)
    if (shot.count({x_of(1), y, x_of(30) - x_of(1), 1}, kRunColor) > 0) {
      top = std::min(top, y);
      bottom = std::max(bottom, y);
    }
  EXPECT_GT(bottom - top, loss.h / 3) << "the curve was squashed: the rolled-back rows set the axis";
}

// A dooming step found (a `doom` event at step 30 about step 70, which was
// skipped non-finite): its marker, and a bracket along the top from it to the
// step it doomed, nowhere else.
TEST_F(ViewerScreenshot, TheDoomingStepIsMarkedAndLinkedToTheStepItDoomed) {
  test::TempDir dir;
  {
    format::RunWriter writer(dir.file("run.h5"), test::synthetic_header(3), 64);
    for (int64_t s = 0; s < 100; ++s) {
      writer.append(test::synthetic_row(s, 3, 70));
      if (s == 70) writer.event(s, format::EventKind::skip, "non-finite loss; step skipped");
    }
    writer.event(30, format::EventKind::doom,
                 "step 30 doomed step 70: without batch row 3 (data set row 12) the steps up to 70 stay finite; "
                 "12 replays from the state after step 24, 117 steps run, 0.5 s");
  }
  const LossPlot plot = show_loss_plot(dir.file("run.h5"), dir.file("run.png"));
  ASSERT_TRUE(plot.shown()) << plot.viewer.output;
  const Screenshot& shot = plot.shot;
  const Region loss = plot.loss;
  const auto x_of = [&](double step) { return plot.x_of(step); };
  const Rgb doom = rgb_of(viewer::rgba(255, 40, 200));  // the doom event's colour
  EXPECT_GT(shot.count({x_of(30.5) - 5, loss.y, 10, loss.h}, doom, 30), 10) << "the marker at step 30";
  const Region bracket{x_of(35), loss.y, x_of(65) - x_of(35), 24};
  EXPECT_GT(shot.count(bracket, doom, 30), bracket.w * 3 / 4) << "the link from step 30 to step 70";
  EXPECT_GT(shot.count({x_of(70.5) - 6, loss.y + 8, 12, 10}, doom, 30), 10) << "its arrow at step 70";
  EXPECT_EQ(shot.count({x_of(75), loss.y, x_of(95) - x_of(75), 24}, doom, 30), 0) << "no link past step 70";
  EXPECT_EQ(shot.count({x_of(5), loss.y, x_of(25) - x_of(5), 24}, doom, 30), 0) << "no link before step 30";
}

TEST_F(ViewerScreenshot, SnapshotShowsLayerNormsWithTheNaNLayer) {
  test::TempDir dir;
  const std::string snapshot = dir.file("step-0000150.h5");
  test::write_synthetic_snapshot(snapshot, 150, 8, /*replayed=*/true);
  auto r = view(snapshot, dir.file("snapshot.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("snapshot.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("snapshot.layers")) << "the Snapshot tab opens for a snapshot alone\n" << r.output;
  const Region bars = shot.region("snapshot.layers");
  // 8 bars, one row each: layer 1 (the second row) is NaN, the others finite.
  const int row = bars.h / 8;
  EXPECT_GT(shot.count({bars.x, bars.y + row, bars.w, row}, kNaN, 10), bars.w / 2);
  EXPECT_EQ(shot.count({bars.x, bars.y + 3 * row, bars.w, row}, kNaN, 10), 0);
  EXPECT_GT(colormap_share(shot, {bars.x, bars.y + 7 * row + 1, 20, row - 2}, nullptr), 0.9);
}

// A replayed precision verdict's trail in the Snapshot tab: each op's error
// as a bar, the ops within rounding in one colour, the first op past the
// margin (where precision was lost) in another, and marked.
TEST_F(ViewerScreenshot, APrecisionTrailMarksTheOpWherePrecisionWasLost) {
  test::TempDir dir;
  const std::string snapshot = dir.file("step-0000150.h5");
  test::write_synthetic_snapshot(snapshot, 150, 8, /*replayed=*/true);
  {
    auto archive = format::Archive::open(snapshot, format::kSnapshotFileKind, true);
    format::ReplayRecord record = *format::read_replay_record(archive.root());
    record.verdict = format::Verdict::precision;
    format::PrecisionTrail trail;
    trail.type = "bfloat16";
    const std::vector<std::pair<const char*, double>> ops = {
        {"aten::mul", 0.5}, {"aten::mean", 1}, {"aten::sub", 300}, {"aten::sqrt", 120}, {"aten::div", INFINITY}};
    for (size_t i = 0; i < ops.size(); ++i) {
      format::OpError e;
      e.op.index = int64_t(40 + i);
      e.op.op = ops[i].first;
      e.op.module = "blocks.0.ln1";
      e.ulps = ops[i].second;
      e.nonfinite = std::isinf(e.ulps) ? 16 : 0;
      trail.ops.push_back(e);
    }
    trail.first_lost = format::first_precision_loss(trail.ops, trail.margin_ulps);
    record.precision_trail = trail;
    format::write_replay_record(archive.root(), record);
    archive.close();
  }
  auto r = view(snapshot, dir.file("trail.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("trail.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("snapshot.precision_lost")) << r.output;
  ASSERT_TRUE(shot.has("snapshot.precision_trail")) << r.output;
  const Rgb lost{255, 220, 40}, within{110, 150, 200};
  const Region bar = shot.region("snapshot.precision_lost");
  EXPECT_GT(shot.count(bar, lost, 30), bar.w * bar.h / 2) << "the sub's bar in the colour of precision lost";
  const Region first = shot.region("snapshot.precision_trail");
  EXPECT_GT(shot.count(first, within, 30), 0) << "the first op's bar within rounding";
  EXPECT_EQ(shot.count(first, lost, 30), 0);
  EXPECT_LT(first.y, bar.y) << "execution order: the first op above the lost one";
}

// A snapshot that carries a TorchScript program says, in the tab where a
// user decides to replay it, that replaying runs that program; one that
// carries no code says nothing of the kind.
TEST_F(ViewerScreenshot, ASnapshotCarryingAProgramWarnsThatReplayingRunsIt) {
  test::TempDir dir;
  const std::string plain = dir.file("step-0000150.h5"), scripted = dir.file("step-0000151.h5");
  test::write_synthetic_snapshot(plain, 150, 8, /*replayed=*/false);
  test::write_synthetic_snapshot(scripted, 151, 8, /*replayed=*/false);
  {
    auto archive = format::Archive::open(scripted, format::kSnapshotFileKind, true);
    const std::string program(4096, 'x');
    archive.root().group("model").put_blob("torchscript", program.data(), program.size());
    archive.close();
  }
  const Rgb warning{255, 150, 60};
  auto r = view(scripted, dir.file("scripted.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("scripted.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("snapshot.code_warning")) << r.output;
  const Region line = shot.region("snapshot.code_warning");
  EXPECT_GT(shot.count(line, warning, 60), 50) << "the warning is drawn in its colour";

  r = view(plain, dir.file("plain.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot quiet(dir.file("plain.png"), r.output);
  ASSERT_TRUE(quiet.loaded());
  EXPECT_FALSE(quiet.has("snapshot.code_warning")) << r.output;
  EXPECT_EQ(quiet.count(line, warning, 60), 0) << "nothing in the warning's colour where it would be";
}

TEST_F(ViewerScreenshot, BadFileIsReportedAndTheGoodRunStillShown) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "run");
  test::write_synthetic_run(dir.file("run/run.h5"), 400, 12, 250);
  const std::string bad = dir.file("garbage.h5");
  std::ofstream(bad) << "this is not HDF5";
  auto r = view(dir.file("run") + " " + bad, dir.file("bad.png"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("garbage.h5': not an HDF5 file"), std::string::npos) << r.output;
  Screenshot shot(dir.file("bad.png"), r.output);
  ASSERT_TRUE(shot.loaded()) << "the screenshot is still written";
  const Region loss = shot.region("plot.loss");
  EXPECT_GT(shot.count(loss, kRunColor), loss.w / 2);
  const int nan_x = loss.x + int(250.5 / 400.0 * loss.w);
  EXPECT_GT(shot.count({nan_x - 6, loss.y, 12, 8}, kNaN, 10), 5);
}

// Two data-parallel ranks where only rank 1's local gradients went NaN, at
// step 40 of 60: the ranks' heatmaps stand side by side on one step axis, the
// NaN column is in rank 1's alone, and rank 1 alone is framed and titled in
// red as the first rank to go non-finite.
TEST_F(ViewerScreenshot, RanksSideBySideWithTheFirstNonfiniteRankFramed) {
  test::TempDir dir;
  const std::string run = dir.file("run");
  test::write_synthetic_rank_dir(run, 2, 60, 10, /*nan_rank=*/1, /*nan_step=*/40, "1");
  auto r = view(run, dir.file("ranks.png"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Screenshot shot(dir.file("ranks.png"), r.output);
  ASSERT_TRUE(shot.loaded());
  ASSERT_TRUE(shot.has("heatmap-rank-0") && shot.has("heatmap-rank-1") && shot.has("heatmap")) << r.output;
  const Region rank0 = shot.region("heatmap-rank-0"), rank1 = shot.region("heatmap-rank-1");

  // Side by side: one row, rank 1 right of rank 0 with a gap, the same size.
  EXPECT_EQ(rank0.y, rank1.y);
  EXPECT_EQ(rank0.h, rank1.h);
  EXPECT_GT(rank1.x, rank0.x + rank0.w);
  EXPECT_LE(std::abs(rank0.w - rank1.w), 2);
  EXPECT_GT(rank0.w, 300);
  // "heatmap" is the chosen run's: the first non-finite rank is shown first.
  EXPECT_EQ(shot.region("heatmap").x, rank1.x);

  // Both are drawn in the colour map; step 40's column is NaN through every
  // layer on rank 1 and nowhere on rank 0.
  EXPECT_GT(colormap_share(shot, rank0, nullptr), 0.85);
  EXPECT_GT(colormap_share(shot, rank1, nullptr), 0.85);
  const int column1 = rank1.x + int(40.5 / 60.0 * rank1.w);
  EXPECT_GT(shot.count({column1 - 2, rank1.y, 5, rank1.h}, kNaN, 10), rank1.h);
  EXPECT_EQ(shot.count(rank0, kNaN, 10), 0);

  // The red frame just outside rank 1's heatmap (left, right and bottom
  // strips; the top one meets the title), none around rank 0's; the title
  // above rank 1's is red, rank 0's is not.
  const Rgb marker = rgb_of(viewer::kFirstNonfiniteRankColor);
  auto frame_pixels = [&](const Region& h) {
    return shot.count({h.x - 7, h.y, 6, h.h}, marker, 10) + shot.count({h.x + h.w + 1, h.y, 6, h.h}, marker, 10) +
           shot.count({h.x, h.y + h.h + 1, h.w, 6}, marker, 10);
  };
  EXPECT_GT(frame_pixels(rank1), 2 * rank1.h + rank1.w) << r.output;
  EXPECT_EQ(frame_pixels(rank0), 0);
  EXPECT_GT(shot.count({rank1.x, rank1.y - 30, rank1.w, 20}, marker, 10), 20);
  EXPECT_EQ(shot.count({rank0.x, rank0.y - 30, rank0.w, 20}, marker, 10), 0);
}

TEST(ViewerCli, WithoutADisplayItSaysSoAndExitsOne) {
  auto r = test::run_command("env -u DISPLAY -u WAYLAND_DISPLAY " + kView + " /nonexistent");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("xvfb-run"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent"), std::string::npos) << "the bad input is reported too";
}

TEST(ViewerCli, NoInputIsAUsageError) {
  auto r = test::run_command(kView);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("paths is required"), std::string::npos) << r.output;
}
