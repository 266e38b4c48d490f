// A long run in the viewer's model (no window): read through its overview,
// not its rows; a single NaN step shows in its block at the whole-run zoom,
// in the heatmap and in the curves; zoomed in, the view's rows are fetched
// behind the frames and show the step itself; a followed run that grows long
// goes over to its overview; a file without one has it built from its rows.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/viewer/heatmap.hpp"
#include "nanscope/viewer/layer_table.hpp"
#include "nanscope/viewer/view_model.hpp"
#include "synthetic_files.hpp"

using namespace nanscope;
using viewer::OverviewTable;

namespace {

constexpr int64_t kSteps = 200000, kNaNStep = 123457;
constexpr size_t kLayers = 4, kNaNLayer = 2;  // synthetic_row's NaN layer

// (layer, column) of every NaN pixel of `image`.
std::set<std::pair<size_t, size_t>> nan_pixels(const viewer::HeatmapImage& image) {
  std::set<std::pair<size_t, size_t>> out;
  for (size_t l = 0; l < image.rows; ++l)
    for (size_t c = 0; c < image.columns; ++c)
      if (image.rgba[l * image.columns + c] == viewer::kNaNColor) out.insert({l, c});
  return out;
}

// The columns of [x0, x1) over `columns` pixels that steps [first, last] reach.
std::set<size_t> columns_of_steps(int64_t first, int64_t last, double x0, double x1, size_t columns) {
  const double per_column = (x1 - x0) / double(columns);
  std::set<size_t> out;
  for (size_t c = 0; c < columns; ++c) {
    const double a = x0 + double(c) * per_column, b = a + per_column;
    if (double(last) + 1 > a && double(first) < b) out.insert(c);
  }
  return out;
}
std::set<size_t> columns_of_step(int64_t step, double x0, double x1, size_t columns) {
  return columns_of_steps(step, step, x0, x1, columns);
}
// The columns the block of 64 steps holding `step` reaches (the run's steps
// are its rows here, from 0): what a whole-run view marks.
std::set<size_t> columns_of_block(int64_t step, double x0, double x1, size_t columns) {
  const int64_t first = step / 64 * 64;
  return columns_of_steps(first, first + 63, x0, x1, columns);
}

std::set<size_t> nan_columns(const std::vector<viewer::Column>& columns) {
  std::set<size_t> out;
  for (size_t c = 0; c < columns.size(); ++c)
    if (columns[c].nonfinite & viewer::kNaN) out.insert(c);
  return out;
}

// The run's grad-norm heatmap of steps [x0, x1) over `columns` pixels, as
// the panel draws it.
viewer::HeatmapImage heatmap(const viewer::RunSource& run, double x0, double x1, size_t columns) {
  viewer::HeatmapImage image;
  viewer::render_heatmap(run.grad_norm_grid({x0, x1}, columns), x0, x1, columns,
                         viewer::LogScale::spanning(run.grad_norm_min(), run.grad_norm_max()), image);
  return image;
}

// The NaN layer's cells in `columns`: where a heatmap's NaN pixels belong.
std::set<std::pair<size_t, size_t>> nan_layer_cells(const std::set<size_t>& columns) {
  std::set<std::pair<size_t, size_t>> out;
  for (size_t c : columns) out.insert({kNaNLayer, c});
  return out;
}

// Polls until a window of rows has come in, or a minute (a hang) has passed.
bool poll_until_window(viewer::ViewModel& model, const viewer::RunSource& run) {
  const size_t revision = run.revision();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (run.revision() == revision && std::chrono::steady_clock::now() < deadline) {
    model.poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return run.revision() != revision;
}

class LongRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    path_ = dir_->file("run.h5");
    test::write_long_synthetic_run(path_, kSteps, kLayers, kNaNStep);
  }
  static void TearDownTestSuite() { delete dir_; }
  static test::TempDir* dir_;
  static std::string path_;
};
test::TempDir* LongRun::dir_ = nullptr;
std::string LongRun::path_;

}  // namespace

TEST_F(LongRun, ASingleNaNStepShowsInItsBlockInTheHeatmapAndTheCurvesAtTheWholeRunZoom) {
  viewer::ViewModel model;
  ASSERT_TRUE(model.open({path_})) << model.errors().front();
  const viewer::RunSource& run = model.runs.at(0);
  ASSERT_TRUE(run.is_long());
  EXPECT_EQ(run.data().rows(), size_t(kSteps));
  EXPECT_TRUE(run.data().layer_grad_norm.empty()) << "the per-layer rows are not read";
  EXPECT_EQ(run.first_nonfinite_step(), kNaNStep);

  const double x0 = 0, x1 = double(kSteps);
  const size_t columns = 900;
  EXPECT_EQ(run.grad_norm_grid({x0, x1}, columns).steps_per_row, 64) << "drawn from the finest blocks";
  const auto expected = nan_layer_cells(columns_of_block(kNaNStep, x0, x1, columns));
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(nan_pixels(heatmap(run, x0, x1, columns)), expected)
      << "one NaN cell of one step among 200,000, in its layer's row only";

  // The loss curve: the one column holding the step is marked, no other.
  std::vector<viewer::Column> loss;
  viewer::decimate_series(run.data().step.data(), viewer::series(run.data().loss),
                          run.scalar_blocks(format::OverviewScalar::loss), x0, x1, 480, loss);
  EXPECT_EQ(nan_columns(loss), columns_of_block(kNaNStep, x0, x1, 480));
  // The layer's own plot likewise, from its blocks.
  std::vector<viewer::Column> layer;
  viewer::decimate_series(run.layer_row_steps(), run.layer_rows(OverviewTable::layer_grad_norm, kNaNLayer),
                          run.layer_blocks(OverviewTable::layer_grad_norm, kNaNLayer), x0, x1, 480, layer);
  EXPECT_EQ(nan_columns(layer), columns_of_block(kNaNStep, x0, x1, 480));
  viewer::decimate_series(run.layer_row_steps(), run.layer_rows(OverviewTable::layer_grad_norm, 0),
                          run.layer_blocks(OverviewTable::layer_grad_norm, 0), x0, x1, 480, layer);
  EXPECT_TRUE(nan_columns(layer).empty()) << "layer 0 never went NaN";

  // The layer table from the blocks: the latest norm and the abs-max are the rows' own.
  std::vector<viewer::LayerRow> rows;
  viewer::layer_rows(run.data(), *run.overview(), 50, rows);
  ASSERT_EQ(rows.size(), kLayers);
  const format::StepRow last = test::synthetic_row(kSteps - 1, kLayers);
  for (size_t l = 0; l < kLayers; ++l) {
    EXPECT_FLOAT_EQ(float(rows[l].last_norm), last.layer_grad_norm[l]) << l;
    EXPECT_FLOAT_EQ(float(rows[l].act_absmax), 10.0f * float(l + 1)) << l;
    EXPECT_FALSE(rows[l].nonfinite) << "the NaN is far before the last 50 steps";
    EXPECT_GT(rows[l].growth, 1.0) << "the norms grow slowly";
  }
}

TEST_F(LongRun, AZoomedInViewFetchesItsRowsBehindTheFramesAndShowsTheStepItself) {
  viewer::ViewModel model;
  ASSERT_TRUE(model.open({path_}));
  const viewer::RunSource& run = model.runs.at(0);
  const double x0 = double(kNaNStep) - 57, x1 = x0 + 100;
  const size_t columns = 900;  // 9 pixels per step
  // Before the rows are in, the blocks stand in for them.
  EXPECT_EQ(run.grad_norm_grid({x0, x1}, columns).steps_per_row, 64);
  model.focus({x0, x1}, columns);
  ASSERT_TRUE(poll_until_window(model, run)) << "no rows came in a minute";
  ASSERT_TRUE(model.errors().empty()) << model.errors().front();

  EXPECT_EQ(run.grad_norm_grid({x0, x1}, columns).steps_per_row, 1) << "drawn from the rows";
  const auto expected = nan_layer_cells(columns_of_step(kNaNStep, x0, x1, columns));
  EXPECT_EQ(expected.size(), 9u);
  EXPECT_EQ(nan_pixels(heatmap(run, x0, x1, columns)), expected) << "the step's 9 pixels, not its block's 64 steps";

  std::vector<viewer::Column> layer;
  viewer::decimate_series(run.layer_row_steps(), run.layer_rows(OverviewTable::layer_grad_norm, kNaNLayer),
                          run.layer_blocks(OverviewTable::layer_grad_norm, kNaNLayer), x0, x1, 100, layer);
  EXPECT_EQ(nan_columns(layer), std::set<size_t>{57});
  for (size_t c = 0; c < layer.size(); ++c) {
    if (c == 57) continue;
    EXPECT_EQ(layer[c].count, 1) << "one finite row per column, column " << c;
  }
}

TEST_F(LongRun, AFileWithoutItsOverviewHasItBuiltFromItsRowsAndSaysSo) {
  const std::string old = dir_->file("old.h5");
  std::filesystem::copy_file(path_, old);
  {
    format::Archive archive = format::Archive::open(old, format::kRunFileKind, true);
    archive.root().remove("overview");  // as a file written before format 1.12
    archive.close();
  }
  viewer::ViewModel model;
  int64_t last_done = 0, told_rows = 0;
  model.on_overview_build = [&](const std::string& path, int64_t done, int64_t rows) {
    EXPECT_EQ(path, old);
    last_done = done;
    told_rows = rows;
  };
  ASSERT_TRUE(model.open({old})) << model.errors().front();
  const viewer::RunSource& run = model.runs.at(0);
  ASSERT_TRUE(run.overview());
  EXPECT_TRUE(run.overview()->built_from_rows);
  EXPECT_EQ(told_rows, kSteps);
  EXPECT_EQ(last_done, kSteps);
  viewer::HeatmapImage image;
  viewer::render_heatmap(run.grad_norm_grid({0, double(kSteps)}, 900), 0, double(kSteps), 900,
                         viewer::LogScale::spanning(run.grad_norm_min(), run.grad_norm_max()), image);
  std::set<std::pair<size_t, size_t>> expected;
  for (size_t c : columns_of_block(kNaNStep, 0, double(kSteps), 900)) expected.insert({kNaNLayer, c});
  EXPECT_EQ(nan_pixels(image), expected);
}

// A corrupt overview is refused, naming the file: never drawn wrong.
TEST_F(LongRun, ACorruptOverviewIsAnErrorNamingTheFileNotAWrongPicture) {
  const std::string bad = dir_->file("corrupt.h5");
  std::filesystem::copy_file(path_, bad, std::filesystem::copy_options::overwrite_existing);
  const auto r = test::run_command(std::string(test::paths::python) +
                                   " -c \"import h5py, sys\nwith h5py.File(sys.argv[1], 'r+') as f: "
                                   "f['overview/64/layer_grad_norm_counts'][100, 2] = 4000000000\" " +
                                   bad);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  viewer::ViewModel model;
  EXPECT_FALSE(model.open({bad}));
  ASSERT_EQ(model.errors().size(), 1u);
  EXPECT_TRUE(model.runs.empty());
  EXPECT_NE(model.errors()[0].find(bad), std::string::npos) << model.errors()[0];
  EXPECT_NE(model.errors()[0].find("/overview/64"), std::string::npos) << model.errors()[0];
}

// A run followed from its start: short (every row in memory) until it grows
// past kLongRunRows, then read through its overview, and its new rows keep
// coming in (a NaN planted after the switch shows).
TEST(LongRunLive, AFollowedRunThatGrowsLongGoesOverToItsOverview) {
  test::TempDir dir;
  const std::string path = dir.file("run.h5");
  const int64_t short_rows = 1000, long_rows = int64_t(viewer::kLongRunRows) + 5000, nan_step = long_rows - 100;
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  if (child == 0) {
    format::RunWriter writer(path, test::synthetic_header(kLayers), 4096);
    for (int64_t s = 0; s < short_rows; ++s) writer.append(test::synthetic_row(s, kLayers));
    writer.flush();
    char c = 'x';
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);
    for (int64_t s = short_rows; s < long_rows; ++s) writer.append(test::synthetic_row(s, kLayers, nan_step));
    writer.flush();
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);  // until the parent has read: the file stays open for writing
    _exit(0);
  }
  char c = 'x';
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  viewer::ViewModel model;
  ASSERT_TRUE(model.open({path})) << model.errors().front();
  EXPECT_FALSE(model.runs[0].is_long());
  EXPECT_EQ(model.runs[0].data().layer_grad_norm.size(), size_t(short_rows) * kLayers);
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  EXPECT_TRUE(model.poll());
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  waitpid(child, nullptr, 0);

  const viewer::RunSource& run = model.runs[0];
  ASSERT_TRUE(run.is_long());
  EXPECT_EQ(run.data().rows(), size_t(long_rows));
  EXPECT_TRUE(run.data().layer_grad_norm.empty()) << "the per-layer rows were dropped";
  EXPECT_EQ(run.overview()->rows, long_rows);
  EXPECT_EQ(run.first_nonfinite_step(), nan_step);
  const double x1 = double(long_rows);
  EXPECT_EQ(nan_pixels(heatmap(run, 0, x1, 700)), nan_layer_cells(columns_of_block(nan_step, 0, x1, 700)));
}
