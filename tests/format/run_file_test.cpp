#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/version.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

RunHeader two_layer_header() {
  RunHeader header;
  header.layer_names = {"encoder.fc", "head"};
  header.record_act_absmax = true;
  header.config = {{"model", "gpt"}, {"lr", "0.001"}};
  return header;
}

StepRow row_for(int64_t step) {
  StepRow row;
  row.step = step;
  row.loss = 10.0 - step;
  row.lr = 1e-3;
  row.loss_scale = 65536.0 / (1 << (step % 3));
  row.grad_norm = 0.5 * step;
  row.skipped = step % 5 == 4;
  row.amp = step < 7 ? Precision::fp16 : Precision::fp32;
  row.step_time = 0.01 * step;
  row.layer_grad_norm = {float(step), float(2 * step)};
  row.layer_act_absmax = {float(step) + 0.5f, float(step) + 1.5f};
  return row;
}

// Expects `fn` to throw a FormatError whose message holds both the file name and `what`.
template <typename Fn>
void expect_format_error(Fn fn, const std::string& path, const std::string& what) {
  try {
    fn();
    FAIL() << "no error for " << path;
  } catch (const FormatError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

}  // namespace

TEST(RunFile, RoundTripsEveryColumnEventAndConfig) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, two_layer_header(), /*flush_every=*/4);
    for (int64_t s = 0; s < 10; ++s) writer.append(row_for(s));
    writer.event(4, EventKind::skip, "non-finite loss at fp16");
    writer.event(7, EventKind::fallback, "fp16 -> fp32, LR x 0.5");
  }
  RunData run = read_run(path);
  ASSERT_EQ(run.rows(), 10u);
  EXPECT_EQ(run.format_version, std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor));
  EXPECT_EQ(run.layer_names, (std::vector<std::string>{"encoder.fc", "head"}));
  EXPECT_EQ(run.config.at("model"), "gpt");
  EXPECT_EQ(run.config.at("lr"), "0.001");
  for (int64_t s = 0; s < 10; ++s) {
    const StepRow want = row_for(s);
    EXPECT_EQ(run.step[s], s);
    EXPECT_DOUBLE_EQ(run.loss[s], want.loss);
    EXPECT_DOUBLE_EQ(run.loss_scale[s], want.loss_scale);
    EXPECT_DOUBLE_EQ(run.grad_norm[s], want.grad_norm);
    EXPECT_DOUBLE_EQ(run.step_time[s], want.step_time);
    EXPECT_EQ(run.skipped[s], want.skipped ? 1 : 0);
    EXPECT_EQ(run.amp[s], uint8_t(want.amp));
    EXPECT_FLOAT_EQ(run.layer_grad_norm[s * 2 + 1], float(2 * s));
    EXPECT_FLOAT_EQ(run.layer_act_absmax[s * 2], float(s) + 0.5f);
  }
  ASSERT_EQ(run.events.size(), 2u);
  EXPECT_EQ(run.events[1].step, 7);
  EXPECT_EQ(run.events[1].kind, EventKind::fallback);
  EXPECT_EQ(run.events[1].text, "fp16 -> fp32, LR x 0.5");
}

TEST(RunFile, RowWithoutLayerValuesKeepsNaNPlaceholders) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, two_layer_header());
    StepRow row = row_for(0);
    row.layer_grad_norm.clear();
    writer.append(row);
  }
  RunData run = read_run(path);
  ASSERT_EQ(run.layer_grad_norm.size(), 2u);
  EXPECT_TRUE(std::isnan(run.layer_grad_norm[0]));
}

TEST(RunFile, WithoutLayersHasNoLayerTables) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, RunHeader{});
    writer.append(row_for(0));
  }
  RunData run = read_run(path);
  EXPECT_EQ(run.rows(), 1u);
  EXPECT_TRUE(run.layer_names.empty());
  EXPECT_TRUE(run.layer_grad_norm.empty());
}

TEST(RunFile, FlushedRowsAreReadableWhileTheWriterIsOpen) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  // The writer lives in a child process, as a trainer would; the parent reads.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  if (child == 0) {
    RunWriter writer(path, two_layer_header(), /*flush_every=*/1);
    for (int64_t s = 0; s < 6; ++s) writer.append(row_for(s));
    char c = 'x';
    (void)!write(ready[1], &c, 1);
    std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by the parent first
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  RunData live = read_run(path);
  EXPECT_EQ(live.rows(), 6u);
  EXPECT_DOUBLE_EQ(live.loss[5], 5.0);
  // SIGKILL: no destructor, no close; the flushed rows must survive.
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  RunData after = read_run(path);
  EXPECT_EQ(after.rows(), 6u);
  EXPECT_EQ(after.layer_grad_norm.size(), 12u);
}

TEST(RunFile, FollowerSeesRowsAndEventsAppendedByALiveWriter) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  if (child == 0) {
    RunWriter writer(path, two_layer_header(), /*flush_every=*/4);
    for (int64_t s = 0; s < 8; ++s) writer.append(row_for(s));
    char c = 'x';
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);  // the parent has opened the file
    for (int64_t s = 8; s < 20; ++s) writer.append(row_for(s));
    writer.event(19, EventKind::fallback, "to fp32");
    writer.flush();
    (void)!write(to_parent[1], &c, 1);
    std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by the parent first
    _exit(0);
  }
  char c = 'x';
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  RunFollower follower(path);
  EXPECT_EQ(follower.data().rows(), 8u);
  EXPECT_EQ(follower.refresh(), 0u);  // nothing new yet
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  EXPECT_EQ(follower.refresh(), 12u);
  const RunData& run = follower.data();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_EQ(run.rows(), 20u);
  for (int64_t s = 0; s < 20; ++s) {
    EXPECT_EQ(run.step[s], s);
    EXPECT_DOUBLE_EQ(run.loss[s], 10.0 - s);
    EXPECT_FLOAT_EQ(run.layer_grad_norm[s * 2 + 1], 2.0f * s);
    EXPECT_FLOAT_EQ(run.layer_act_absmax[s * 2], s + 0.5f);
  }
  ASSERT_EQ(run.events.size(), 1u);
  EXPECT_EQ(run.events[0].kind, EventKind::fallback);
}

TEST(RunFile, FileKindNamesEachKindAndRejectsForeignFiles) {
  TempDir dir;
  const std::string run = dir.file("run.h5");
  { RunWriter writer(run, two_layer_header()); }
  EXPECT_EQ(file_kind(run), kRunFileKind);
  const std::string snapshot = dir.file("snap.h5");
  Archive archive = Archive::create(snapshot, kSnapshotFileKind);
  archive.close();
  EXPECT_EQ(file_kind(snapshot), kSnapshotFileKind);
  const std::string text = dir.file("notes.txt");
  std::ofstream(text) << "hello";
  expect_format_error([&] { file_kind(text); }, text, "HDF5");
}

TEST(RunFile, MissingFileNamesTheFile) {
  TempDir dir;
  const std::string path = dir.file("nope.h5");
  expect_format_error([&] { read_run(path); }, path, "no such file");
}

TEST(RunFile, EmptyFileSaysEmpty) {
  TempDir dir;
  const std::string path = dir.file("empty.h5");
  std::ofstream(path).close();
  expect_format_error([&] { read_run(path); }, path, "file is empty");
}

TEST(RunFile, TextFileIsNotHdf5) {
  TempDir dir;
  const std::string path = dir.file("notes.h5");
  std::ofstream(path) << "step,loss\n0,1.0\n";
  expect_format_error([&] { read_run(path); }, path, "not an HDF5 file");
}

TEST(RunFile, TruncatedFileGivesAClearError) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, two_layer_header());
    for (int64_t s = 0; s < 200; ++s) writer.append(row_for(s));
  }
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  try {
    read_run(path);
    FAIL() << "a truncated file was read";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(RunFile, CorruptBytesGiveAClearError) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    RunWriter writer(path, two_layer_header());
    for (int64_t s = 0; s < 50; ++s) writer.append(row_for(s));
  }
  {
    // Keep the signature, scramble the metadata after it.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(48);
    for (int i = 0; i < 4000; ++i) f.put(char(i * 37 + 11));
  }
  try {
    read_run(path);
    FAIL() << "a corrupt file was read";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(RunFile, ForeignHdf5FileIsRejected) {
  TempDir dir;
  const std::string path = dir.file("snapshot.h5");
  Archive::create(path, kSnapshotFileKind).close();
  expect_format_error([&] { read_run(path); }, path, "expected nanscope-run");
}

TEST(RunFile, NewerMajorVersionIsRejected) {
  TempDir dir;
  const std::string path = dir.file("run.h5");
  {
    Archive archive = Archive::create(path, kRunFileKind);
    archive.root().set_attr("format_version", std::string("2.0"));
    archive.close();
  }
  expect_format_error([&] { read_run(path); }, path, "format_version 2.0 is not supported");
}

TEST(RunFile, WriterMarkIsSetWhileTheWriterHoldsTheFileAndAfterItWasKilled) {
  TempDir dir;
  const std::string closed = dir.file("closed.h5");
  {
    RunWriter writer(closed, two_layer_header(), /*flush_every=*/1);
    writer.append(row_for(0));
    EXPECT_TRUE(has_writer_mark(closed));
    RunFollower reader(closed);  // a reader holding the file open still sees the writer's word
    EXPECT_TRUE(has_writer_mark(closed));
  }
  EXPECT_FALSE(has_writer_mark(closed));

  // A writer that ends without closing (SIGKILL, _exit) leaves the mark until it is cleared.
  const std::string killed = dir.file("killed.h5");
  const pid_t child = fork();
  if (child == 0) {
    RunWriter writer(killed, two_layer_header(), /*flush_every=*/1);
    writer.append(row_for(0));
    _exit(0);
  }
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(has_writer_mark(killed));
  EXPECT_TRUE(clear_writer_mark(killed));
  EXPECT_FALSE(has_writer_mark(killed));

  const std::string text = dir.file("notes.txt");
  std::ofstream(text) << "not hdf5 at all";
  expect_format_error([&] { has_writer_mark(text); }, text, "HDF5");
  expect_format_error([&] { has_writer_mark(dir.file("missing.h5")); }, dir.file("missing.h5"), "cannot open");
}
