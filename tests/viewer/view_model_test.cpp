// The viewer's ViewModel: what it opens, what it refuses, and live follow.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/viewer/decimate.hpp"
#include "nanscope/viewer/layer_table.hpp"
#include "nanscope/viewer/snapshot_text.hpp"
#include "nanscope/viewer/view_model.hpp"
#include "synthetic_files.hpp"

using namespace nanscope;
using viewer::ViewModel;

namespace {

bool mentions(const std::vector<std::string>& errors, const std::string& path, const std::string& what) {
  for (const auto& e : errors)
    if (e.find(path) != std::string::npos && e.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(ViewModel, OpensARunDirectoryWithItsSnapshots) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "run/snapshots");
  test::write_synthetic_run(dir.file("run/run.h5"), 300, 6, 150);
  test::write_synthetic_snapshot(dir.file("run/snapshots/step-0000150.h5"), 150, 6, true);
  ViewModel model;
  ASSERT_TRUE(model.open({dir.file("run")}));
  ASSERT_EQ(model.runs.size(), 1u);
  EXPECT_EQ(model.runs[0].label(), "run");
  EXPECT_EQ(model.runs[0].data().rows(), 300u);
  EXPECT_EQ(model.runs[0].first_nonfinite_step(), 150);
  EXPECT_EQ(model.runs[0].grad_norms().layers(), 6u);
  EXPECT_DOUBLE_EQ(model.step_extent().hi, 300);
  ASSERT_EQ(model.snapshots.size(), 1u);
  const auto& s = *model.snapshots[0].summary;
  EXPECT_EQ(model.snapshots[0].run, 0);
  EXPECT_EQ(s.step, 150);
  EXPECT_EQ(s.capture.first_birth->op.op, "aten::log");
  EXPECT_EQ(s.capture.first_birth->op.module, "blocks.1.fc");
  EXPECT_EQ(s.capture.trail.size(), 2u);
  EXPECT_TRUE(std::isnan(s.layer_grad_norm[1]));
  EXPECT_EQ(s.batch_rows, (std::vector<int64_t>{7, 3, 11, 5}));
  ASSERT_TRUE(s.replay);
  EXPECT_EQ(s.replay->verdict, format::Verdict::model_or_data);
  EXPECT_EQ(s.replay->samples, "2");
  // What the snapshot panel says of the sample: the birth's row and replay's, with its data set row.
  EXPECT_EQ(viewer::offending_sample_lines(s),
            (std::vector<std::string>{"aten::log made batch row 2 (data set row 11) of 4 non-finite",
                                      "replay: the step is finite without batch row 2 (data set row 11)"}));
}

// Only fp16 has a loss scaler (playbook P5, P6): a bf16 or fp32 run records a
// flat scale of 1, which the loss-scale plot leaves out (and, with no other
// run, says "no scaler" instead). A run with fp16 steps has one, also after
// its fallback to fp32.
TEST(ViewModel, OnlyARunWithFp16StepsHasALossScaler) {
  test::TempDir dir;
  test::write_synthetic_run(dir.file("bf16.h5"), 30, 2, -1, format::Precision::bf16);
  test::write_synthetic_run(dir.file("fp32.h5"), 30, 2, -1, format::Precision::fp32);
  {
    format::RunWriter writer(dir.file("fp16-then-fp32.h5"), test::synthetic_header(2), 64);
    for (int64_t s = 0; s < 30; ++s)
      writer.append(test::synthetic_row(s, 2, -1, s < 10 ? format::Precision::fp16 : format::Precision::fp32));
  }
  ViewModel model;
  ASSERT_TRUE(model.open({dir.file("bf16.h5"), dir.file("fp32.h5"), dir.file("fp16-then-fp32.h5")}));
  ASSERT_EQ(model.runs.size(), 3u);
  EXPECT_FALSE(model.runs[0].has_loss_scaler());
  EXPECT_FALSE(model.runs[1].has_loss_scaler());
  EXPECT_TRUE(model.runs[2].has_loss_scaler());
}

namespace {

format::SnapshotSummary summary_with(std::optional<format::Birth> birth, std::vector<int64_t> batch_rows,
                                     const std::string& replay_samples = "") {
  format::SnapshotSummary s;
  s.capture.first_birth = std::move(birth);
  s.batch_rows = std::move(batch_rows);
  if (!replay_samples.empty()) {
    s.replay.emplace();
    s.replay->samples = replay_samples;
  }
  return s;
}

format::Birth internal_birth(std::vector<int64_t> rows) {
  format::Birth b;
  b.op.op = "aten::log";
  b.op.module = "enc";
  b.rows = std::move(rows);
  return b;
}

}  // namespace

// A user's own loop that gives no data set rows leaves -1 in /batch/rows:
// the panel says "data set row unknown", never -1 and never the batch
// position in its place; and the birth's own rows name the sample where
// replay could not bisect the batch (a model with dropout).
TEST(SnapshotText, NamesTheSampleWithItsDataSetRowOrSaysItIsUnknown) {
  format::Birth input;
  input.op.op = "input";
  input.op.phase = format::Phase::input;
  input.sample = 1;
  EXPECT_EQ(viewer::offending_sample_lines(summary_with(input, {40, -1, 42})),
            std::vector<std::string>{"batch row 1 (data set row unknown) arrived non-finite"});
  EXPECT_EQ(viewer::offending_sample_lines(summary_with(input, {40, 41, 42})),
            std::vector<std::string>{"batch row 1 (data set row 41) arrived non-finite"});

  EXPECT_EQ(viewer::offending_sample_lines(summary_with(internal_birth({0, 2}), {-1, -1, -1, -1})),
            std::vector<std::string>{
                "aten::log made batch rows 0 (data set row unknown), 2 (data set row unknown) of 4 non-finite"});
  EXPECT_EQ(viewer::offending_sample_lines(summary_with(internal_birth({0, 1, 2, 3}), {5, 6, 7, 8})),
            std::vector<std::string>{"aten::log made every row of the batch (4) non-finite: not one sample's doing"});
  EXPECT_EQ(viewer::offending_sample_lines(summary_with(std::nullopt, {-1, -1}, "1")),
            std::vector<std::string>{"replay: the step is finite without batch row 1 (data set row unknown)"});
  EXPECT_TRUE(viewer::offending_sample_lines(summary_with(internal_birth({}), {5, 6})).empty());
}

// The replay box names what each re-run computed in: a model of its own
// float16 weights ran the step in float16 with autocast off, and its fp32
// re-run widened them; it never reads "re-run at fp32 ... fp32: finite".
TEST(SnapshotText, NamesWhatTheReRunsComputedIn) {
  format::SnapshotSummary s;
  EXPECT_EQ(viewer::replay_reruns_line(s), "");
  EXPECT_EQ(format::step_precision_text(s), "unknown");
  s.precision = format::Precision::bf16;
  s.replay.emplace();
  s.replay->reproduced_count = 3;
  s.replay->repeats = 3;
  s.replay->fp32_finite = true;
  EXPECT_EQ(viewer::replay_reruns_line(s), "re-run at bf16: non-finite in 3 of 3; fp32: finite");
  s.precision = format::Precision::fp32;
  s.replay->widened_weights = "float16";
  s.replay->reproduced_count = 2;
  EXPECT_EQ(viewer::replay_reruns_line(s),
            "re-run at float16: non-finite in 2 of 3; fp32: finite (its float16 weights "
            "widened to float32)");
  EXPECT_EQ(format::step_precision_text(s), "float16, the model's own weights");
  s.precision = format::Precision::bf16;  // bf16 autocast over its own weights: autocast's bf16 is what ran
  s.replay->fp32_finite = false;
  EXPECT_EQ(viewer::replay_reruns_line(s),
            "re-run at bf16: non-finite in 2 of 3; fp32: non-finite (its float16 weights widened to float32)");
  EXPECT_EQ(format::step_precision_text(s), "bf16");

  // Before any replay, the type the guard wrote with the snapshot.
  format::SnapshotSummary unreplayed;
  unreplayed.precision = format::Precision::fp32;
  EXPECT_EQ(format::step_precision_text(unreplayed), "fp32");
  unreplayed.config["own_16bit"] = "bfloat16";
  EXPECT_EQ(format::step_precision_text(unreplayed), "bfloat16, the model's own weights");
}

TEST(ViewModel, BadInputsBecomeErrorsAndTheRestStillOpen) {
  test::TempDir dir;
  const std::string good = dir.file("good.h5"), corrupt = dir.file("corrupt.h5"), truncated = dir.file("truncated.h5"),
                    text = dir.file("notes.txt"), checkpoint = dir.file("ckpt.h5"), empty_dir = dir.file("empty");
  test::write_synthetic_run(good, 50, 3, -1);
  test::write_synthetic_run(truncated, 500, 3, -1);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 2);
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    for (size_t i = 2048; i < bytes.size(); i += 7) bytes[i] = char(bytes[i] ^ 0x5a);
    std::ofstream(corrupt, std::ios::binary) << bytes;
  }
  std::ofstream(text) << "not a run";
  format::Archive::create(checkpoint, format::kCheckpointFileKind).close();
  std::filesystem::create_directories(empty_dir);

  ViewModel model;
  EXPECT_FALSE(model.open({good, corrupt, truncated, text, checkpoint, empty_dir, dir.file("missing.h5")}));
  ASSERT_EQ(model.runs.size(), 1u);
  EXPECT_EQ(model.runs[0].data().rows(), 50u);
  EXPECT_TRUE(mentions(model.errors(), text, "not an HDF5 file"));
  EXPECT_TRUE(mentions(model.errors(), checkpoint, "nanscope-checkpoint"));
  EXPECT_TRUE(mentions(model.errors(), empty_dir, "no run.h5"));
  EXPECT_TRUE(mentions(model.errors(), dir.file("missing.h5"), "no such file"));
  EXPECT_TRUE(mentions(model.errors(), corrupt, ""));
  EXPECT_TRUE(mentions(model.errors(), truncated, ""));
  EXPECT_EQ(model.errors().size(), 6u);  // one line per bad input
}

TEST(ViewModel, FollowsALiveRunAndPicksUpNewSnapshots) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "run/snapshots");
  const std::string path = dir.file("run/run.h5");
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  if (child == 0) {
    format::RunWriter writer(path, test::synthetic_header(4), /*flush_every=*/8);
    for (int64_t s = 0; s < 16; ++s) writer.append(test::synthetic_row(s, 4));
    char c = 'x';
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);
    for (int64_t s = 16; s < 40; ++s) writer.append(test::synthetic_row(s, 4, 30));
    writer.event(30, format::EventKind::skip, "non-finite");
    writer.flush();
    test::write_synthetic_snapshot(dir.file("run/snapshots/step-0000030.h5"), 30, 4, false);
    (void)!write(to_parent[1], &c, 1);
    std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by the parent
    _exit(0);
  }
  char c = 'x';
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  ViewModel model;
  ASSERT_TRUE(model.open({dir.file("run")}));
  ASSERT_EQ(model.runs[0].data().rows(), 16u);
  EXPECT_TRUE(model.snapshots.empty());
  EXPECT_FALSE(model.poll());
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  EXPECT_TRUE(model.poll());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const auto& run = model.runs[0];
  EXPECT_EQ(run.data().rows(), 40u);
  EXPECT_EQ(run.rows_since_open(), 24u);
  EXPECT_EQ(run.first_nonfinite_step(), 30);
  EXPECT_EQ(run.grad_norms().rows(), 40u);
  EXPECT_TRUE(std::isnan(run.grad_norms().max_over(2, 28, 32, 1)));
  ASSERT_EQ(run.data().events.size(), 1u);
  ASSERT_EQ(model.snapshots.size(), 1u);
  EXPECT_EQ(model.snapshots[0].summary->step, 30);
  EXPECT_FALSE(model.snapshots[0].summary->replay);
  // The writer is gone (SIGKILL): the rows read so far stay, polling is harmless.
  model.poll();
  EXPECT_EQ(model.runs[0].data().rows(), 40u);
}

// Warnings and rollbacks without a window: the rolled-back rows are left out
// of the curve, the sidebar has the events, the layer table marks the layer.
TEST(ViewModel, RolledBackRowsAreNoPartOfTheCurveAndTheWarnedLayerIsMarked) {
  test::TempDir dir;
  const std::string path = dir.file("run.h5");
  test::write_synthetic_rollback_run(path, 100, 3);
  ViewModel model;
  ASSERT_TRUE(model.open({path}));
  const viewer::RunSource& run = model.runs.at(0);
  const format::RunData& data = run.data();
  ASSERT_EQ(run.rolled_back().size(), data.rows());
  for (size_t i = 0; i < data.rows(); ++i)
    EXPECT_EQ(run.rolled_back()[i], data.step[i] > 40 && data.step[i] <= 60) << "step " << data.step[i];
  EXPECT_EQ(run.off_curve(), run.rolled_back()) << "no skipped rows in this run";
  ASSERT_EQ(run.sentinel_events().size(), 2u);
  EXPECT_EQ(run.sentinel_events()[1].kind, format::EventKind::rollback);

  // The loss curve over all 100 steps: the 1e6 rows are not in any column.
  std::vector<viewer::Column> columns;
  viewer::DecimateOptions options;
  options.left_out = run.rolled_back().data();
  viewer::decimate(data.step.data(), viewer::series(data.loss), 0, 100, 10, columns, options);
  for (const auto& c : columns) EXPECT_LT(c.max, 10.0);
  viewer::decimate(data.step.data(), viewer::series(data.loss), 0, 100, 10, columns);
  EXPECT_EQ(columns[5].max, 1e6) << "without the mask the spike is there";

  std::vector<viewer::LayerRow> rows;
  viewer::layer_rows(data, 20, rows);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].warning_event, -1);
  ASSERT_GE(rows[1].warning_event, 0);
  EXPECT_EQ(data.events[size_t(rows[1].warning_event)].step, 40);
  EXPECT_EQ(rows[2].warning_event, -1);
}

// A snapshot whose flipped bits crash HDF5 itself (tests/fuzz/crashers): the
// viewer lists it as corrupt and goes on with the rest.
TEST(ViewModel, AFileThatCrashesHdf5IsAnErrorNotACrash) {
  test::TempDir dir;
  test::write_synthetic_run(dir.file("run.h5"), 20, 2, -1);
  const std::string crasher = std::string(test::paths::fuzz_crashers) + "/snapshot/h5aiterate-h5a-close.h5";
  ViewModel model;
  EXPECT_FALSE(model.open({crasher, dir.file("run.h5")}));
  // HDF5 1.10 (bookworm) crashes on it and the rehearsal says so; newer HDF5
  // (trixie's 1.14) refuses it with an error of its own. Either way: named, no crash.
  EXPECT_TRUE(mentions(model.errors(), crasher, "crashed the HDF5 library") ||
              mentions(model.errors(), crasher, "cannot"))
      << model.errors().front();
  ASSERT_EQ(model.runs.size(), 1u);
  EXPECT_EQ(model.runs[0].data().rows(), 20u);
}

// Found by fuzzing: a garbled tensor shape in a snapshot's capture threw
// std::invalid_argument out of the reader (and terminated the program). It is
// a FormatError naming the attribute, and the viewer lists it as an error.
TEST(ViewModel, ASnapshotWithAGarbledShapeIsAnErrorNamingIt) {
  test::TempDir dir;
  const std::string path = dir.file("garbled.h5");
  test::write_synthetic_snapshot(path, 7, 3, false);
  {
    format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind, /*writable=*/true);
    archive.root().group("capture").group("first_birth").set_attr("output_shape", std::string("16,x"));
    archive.close();
  }
  try {
    format::read_snapshot_summary(path);
    ADD_FAILURE() << "read a garbled shape";
  } catch (const format::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("output_shape '16,x' is no shape"), std::string::npos) << e.what();
  }
  ViewModel model;
  EXPECT_FALSE(model.open({path}));
  EXPECT_TRUE(mentions(model.errors(), path, "is no shape"));
}
