// run.h5's overview (run_overview.hpp): written as the run goes, it is what
// the rows say (checked against the rows themselves, block by block); a NaN
// or an Inf in one row shows in its block at every level; a resumed run's
// overview is the uninterrupted run's; a file without one gets one built from
// its rows; a corrupt one is refused; a follower keeps it as the run is
// written; rows fetched for a view are the file's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/layer_rows_fetch.hpp"
#include "nanscope/format/overview_follower.hpp"
#include "nanscope/format/rehearsal.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_overview.hpp"
#include "nanscope/format/version.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

constexpr size_t kLayers = 3;
constexpr int64_t kNaNLossStep = 5000, kInfLayerStep = 7777, kRows = 10000;

// A row whose values vary with the step, a NaN loss at one step, an infinite
// norm of layer 1 at another; act_absmax recorded every 10 steps.
StepRow row_for(int64_t step) {
  StepRow row;
  row.step = step;
  row.loss = step == kNaNLossStep ? NAN : 5.0 + std::sin(double(step) * 0.37);
  row.lr = 1e-3 * (1 + step % 7);
  row.loss_scale = 65536.0 / double(1 << (step % 4));
  row.grad_norm = 1.0 + double(step % 113) / 10;
  row.skipped = step == kNaNLossStep || step % 997 == 0;
  row.step_time = 0.01 + 1e-6 * double(step % 31);
  for (size_t l = 0; l < kLayers; ++l) {
    row.layer_grad_norm.push_back(float(1e-3 * double(l + 1) * (1 + std::cos(double(step + l)))));
    row.layer_act_absmax.push_back(step % 10 == 0 ? float(l + step % 17) : NAN);
  }
  if (step == kInfLayerStep) row.layer_grad_norm[1] = INFINITY;
  return row;
}

RunHeader header() {
  RunHeader h;
  h.layer_names = {"embed", "block", "head"};
  h.record_act_absmax = true;
  return h;
}

void write_rows(RunWriter& writer, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) writer.append(row_for(s));
}

// Bitwise, so NaN equals NaN.
template <typename T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <typename T>
void expect_same_stats(const BlockStats<T>& a, const BlockStats<T>& b, const std::string& what) {
  EXPECT_EQ(a.width, b.width) << what;
  EXPECT_TRUE(same(a.min, b.min)) << what << " min";
  EXPECT_TRUE(same(a.max, b.max)) << what << " max";
  EXPECT_TRUE(same(a.last, b.last)) << what << " last";
  EXPECT_EQ(a.nan, b.nan) << what << " NaNs";
  EXPECT_EQ(a.inf, b.inf) << what << " Infs";
}

void expect_same(const RunOverview& a, const RunOverview& b) {
  ASSERT_EQ(a.levels.size(), b.levels.size());
  EXPECT_EQ(a.rows, b.rows);
  for (size_t k = 0; k < a.levels.size(); ++k) {
    const OverviewLevel &x = a.levels[k], &y = b.levels[k];
    const std::string what = "level " + std::to_string(k);
    EXPECT_EQ(x.blocks(), y.blocks()) << what;
    EXPECT_EQ(x.first_step, y.first_step) << what;
    EXPECT_EQ(x.last_step, y.last_step) << what;
    EXPECT_EQ(x.rows, y.rows) << what;
    EXPECT_EQ(x.skipped, y.skipped) << what;
    expect_same_stats(x.scalars, y.scalars, what + " scalars");
    expect_same_stats(x.layer_grad_norm, y.layer_grad_norm, what + " layer_grad_norm");
    expect_same_stats(x.layer_act_absmax, y.layer_act_absmax, what + " layer_act_absmax");
  }
}

// Waits for a fetch to be read (or a minute: a hang); take() then throws if it failed.
void wait_until_ready(LayerRowsFetch& fetch) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!fetch.ready() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The block of `level` that holds row `row`.
size_t block_of(int64_t row, size_t level) { return size_t(row / kOverviewBlockRows[level]); }

}  // namespace

TEST(RunOverview, WrittenAsTheRunGoesItIsWhatTheRowsSay) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, header(), 37);  // batches that straddle the blocks
    write_rows(writer, 0, kRows);
  }
  const RunOverview written = read_run_overview(path);
  EXPECT_FALSE(written.built_from_rows);
  const RunData run = read_run(path);
  expect_same(written, build_overview(run));

  // Each level: its complete blocks, then the run's partial one.
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k) {
    const int64_t block_rows = kOverviewBlockRows[k];
    EXPECT_EQ(int64_t(written.levels[k].blocks()), (kRows + block_rows - 1) / block_rows) << k;
    EXPECT_EQ(written.levels[k].rows.back(), kRows % block_rows == 0 ? block_rows : kRows % block_rows) << k;
  }
  // The rows themselves decide each block's values: level 0, every block.
  const OverviewLevel& finest = written.levels[0];
  for (size_t b = 0; b < finest.blocks(); ++b) {
    const size_t begin = b * 64, end = std::min<size_t>(run.rows(), begin + 64);
    double lo = NAN, hi = NAN;
    uint32_t nans = 0, skips = 0;
    for (size_t r = begin; r < end; ++r) {
      const double v = run.grad_norm[r];
      lo = std::isnan(lo) ? v : std::min(lo, v);
      hi = std::isnan(hi) ? v : std::max(hi, v);
      nans += std::isnan(run.loss[r]);
      skips += run.skipped[r];
    }
    const size_t g = b * kOverviewScalars + size_t(OverviewScalar::grad_norm);
    ASSERT_EQ(finest.scalars.min[g], lo) << "block " << b;
    ASSERT_EQ(finest.scalars.max[g], hi) << "block " << b;
    ASSERT_EQ(finest.scalars.last[g], run.grad_norm[end - 1]) << "block " << b;
    ASSERT_EQ(finest.scalars.nan[b * kOverviewScalars + size_t(OverviewScalar::loss)], nans) << "block " << b;
    ASSERT_EQ(finest.skipped[b], skips) << "block " << b;
    ASSERT_EQ(finest.first_step[b], run.step[begin]);
    ASSERT_EQ(finest.last_step[b], run.step[end - 1]);
  }
}

TEST(RunOverview, OneNaNAndOneInfShowInTheirBlockAtEveryLevelAndNowhereElse) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, header());
    write_rows(writer, 0, kRows);
  }
  const RunOverview overview = read_run_overview(path);
  const size_t loss = size_t(OverviewScalar::loss);
  for (size_t k = 0; k < overview.levels.size(); ++k) {
    const OverviewLevel& level = overview.levels[k];
    for (size_t b = 0; b < level.blocks(); ++b) {
      const bool nan_here = b == block_of(kNaNLossStep, k), inf_here = b == block_of(kInfLayerStep, k);
      ASSERT_EQ(level.scalars.nan[b * kOverviewScalars + loss], nan_here ? 1u : 0u) << "level " << k << " block " << b;
      ASSERT_FALSE(std::isnan(level.scalars.max[b * kOverviewScalars + loss])) << "finite rows beside the NaN";
      ASSERT_EQ(level.layer_grad_norm.inf[b * kLayers + 1], inf_here ? 1u : 0u) << "level " << k << " block " << b;
      ASSERT_EQ(level.layer_grad_norm.inf[b * kLayers + 0], 0u);
      // act_absmax's NaN is "not recorded": never counted, the recorded values kept.
      ASSERT_EQ(level.layer_act_absmax.nan[b * kLayers], 0u);
      ASSERT_FALSE(std::isnan(level.layer_act_absmax.max[b * kLayers])) << "level " << k << " block " << b;
    }
  }
}

TEST(RunOverview, AResumedRunsOverviewIsTheUninterruptedRuns) {
  TempDir dir;
  const std::string whole = dir.file("whole.h5"), resumed = dir.file("resumed.h5");
  {
    RunWriter writer(whole, header(), 50);
    write_rows(writer, 0, kRows);
  }
  {
    RunWriter writer(resumed, header(), 50);
    write_rows(writer, 0, 8200);  // past the resume point: these rows and blocks are dropped
  }
  {
    auto writer = RunWriter::resume(resumed, 4321, 50);  // mid-block at every level
    write_rows(*writer, 4322, kRows);
  }
  expect_same(read_run_overview(resumed), read_run_overview(whole));
}

TEST(RunOverview, AFileWithoutOneGetsItBuiltFromItsRowsSayingHowFar) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, header());
    write_rows(writer, 0, 40000);
  }
  {
    Archive archive = Archive::open(path, kRunFileKind, true);
    archive.root().remove("overview");  // as a file written before 1.12
    archive.close();
  }
  std::vector<int64_t> done;
  const RunOverview built = read_run_overview(path, [&](int64_t rows, int64_t of) {
    EXPECT_EQ(of, 40000);
    done.push_back(rows);
  });
  EXPECT_TRUE(built.built_from_rows);
  ASSERT_GE(done.size(), 2u) << "a long file is read a slice at a time";
  EXPECT_EQ(done.back(), 40000);
  expect_same(built, build_overview(read_run(path)));
}

TEST(RunOverview, ACorruptOverviewIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, header());
    write_rows(writer, 0, 1000);
  }
  // A block that claims 63 rows, a NaN count over its rows: each refused.
  for (const char* edit : {"f['overview/64/blocks'][3, 2] = 63", "f['overview/64/scalars'][2, 3] = 1e9",
                           "f['overview/64/layer_grad_norm_counts'][1, 0] = 4000000000"}) {
    const std::string copy = dir.file("corrupt.h5");
    std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
    auto r = nanscope::test::run_command(std::string(nanscope::test::paths::python) +
                                         " -c \"import h5py, sys\nwith h5py.File(sys.argv[1], 'r+') as f: " + edit +
                                         "\" " + copy);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    try {
      read_run_overview(copy);
      ADD_FAILURE() << "no error for " << edit;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(copy), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("/overview/64"), std::string::npos) << e.what();
    }
  }
}

// The viewer's follower: opened on a run still being written (a child
// process writes it), refreshed as rows come in batches that straddle the
// blocks, it ends where an overview of the whole file's rows does.
TEST(RunOverview, AFollowerExtendsItAsTheRunIsWritten) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const int64_t batches[] = {3000, 3100, 7777, kRows};
  const pid_t child = fork();
  if (child == 0) {
    RunWriter writer(path, header(), 37);
    int64_t written = 0;
    char c = 'x';
    for (int64_t to : batches) {
      write_rows(writer, written, to);
      writer.flush();
      written = to;
      (void)!write(to_parent[1], &c, 1);
      (void)!read(to_child[0], &c, 1);
    }
    _exit(0);
  }
  char c = 'x';
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  OverviewFollower follower(path);
  EXPECT_EQ(follower.overview().rows, batches[0]);
  for (size_t i = 1; i < std::size(batches); ++i) {
    ASSERT_EQ(write(to_child[1], &c, 1), 1);
    ASSERT_EQ(read(to_parent[0], &c, 1), 1);
    EXPECT_EQ(follower.refresh(), size_t(batches[i] - batches[i - 1]));
    EXPECT_EQ(follower.overview().rows, batches[i]);
  }
  EXPECT_EQ(follower.refresh(), 0u);
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  waitpid(child, nullptr, 0);
  expect_same(follower.overview(), build_overview(read_run(path)));
}

// Rows fetched behind a view's back (a child reads them into shared memory)
// are the file's rows; rows the file does not hold, or a file that is not a
// run, are a FormatError naming it, with the rehearsal on or off.
TEST(RunOverview, FetchedRowsAreTheFilesRowsAndBadOnesAnError) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, header());
    write_rows(writer, 0, kRows);
  }
  const RunData run = read_run(path);
  for (bool rehearse : {true, false}) {
    set_rehearsal(rehearse);
    LayerRowsFetch fetch(path, 7700, 7800, kLayers, true, true);
    wait_until_ready(fetch);
    const LayerRows rows = fetch.take();
    ASSERT_EQ(rows.rows(), 100u);
    EXPECT_EQ(rows.from, 7700u);
    for (size_t i = 0; i < 100; ++i) {
      ASSERT_EQ(rows.step[i], run.step[7700 + i]);
      for (size_t l = 0; l < kLayers; ++l) {
        const size_t at = (7700 + i) * kLayers + l;
        ASSERT_TRUE(same(std::vector<float>{rows.grad_norm[i * kLayers + l]}, {run.layer_grad_norm[at]}));
        ASSERT_TRUE(same(std::vector<float>{rows.act_absmax[i * kLayers + l]}, {run.layer_act_absmax[at]}));
      }
    }
    EXPECT_TRUE(std::isinf(rows.grad_norm[(kInfLayerStep - 7700) * kLayers + 1])) << "step 7777's Inf";

    auto expect_refused = [&](const std::string& file, size_t from, size_t to, const char* words) {
      try {
        LayerRowsFetch bad(file, from, to, kLayers, true, true);
        wait_until_ready(bad);
        bad.take();
        ADD_FAILURE() << "no error for " << file << " rows " << from << ".." << to;
      } catch (const FormatError& e) {
        EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    expect_refused(path, kRows - 10, kRows + 10, "holds 10000 rows");
    const std::string not_run = dir.file("not-a-run.h5");
    { std::ofstream(not_run) << "not HDF5 at all"; }
    expect_refused(not_run, 0, 10, not_run.c_str());
  }
  set_rehearsal(true);
}
