// nanscope-report on runs written through the format library: the summary,
// every section, snapshots with their rows and verdicts, JSON, ranks, long
// sections, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../viewer/synthetic_files.hpp"
#include "event_sections.hpp"
#include "json_writer.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/format/event_text.hpp"
#include "report_support.hpp"
#include "snapshots.hpp"

using namespace nanscope;
using test::has_line;
using test::report_tool;
using test::TempDir;

namespace {

// A run that met most of what a run can meet: fp16 with a loss scale that
// halved at the skip of step 30 (first birth, snapshot), a warning at 40, a
// burst 41-60 rolled back to step 40, a skip at 70 and the fallback to fp32
// from step 71 (and a remedy), a refused save at 80. 100 rows: 2 skipped, 20
// taken back, 78 counted.
void write_eventful_run(const std::string& dir) {
  std::filesystem::create_directories(dir + "/snapshots");
  format::RunHeader header = test::synthetic_header(3);
  header.origin = format::Origin::cpp;
  header.config["amp"] = "fp16";
  format::RunWriter writer(dir + "/run.h5", header, 16);
  for (int64_t s = 0; s < 100; ++s) {
    format::StepRow row = test::synthetic_row(s, 3, /*nan_step=*/30);
    row.amp = s <= 70 ? format::Precision::fp16 : format::Precision::fp32;
    row.loss_scale = s <= 30 ? 65536 : s <= 70 ? 32768 : 1;
    if (s > 40 && s <= 60) row.loss = 1e6;
    if (s == 70) {
      row.loss = NAN;
      row.skipped = true;
    }
    writer.append(row);
  }
  writer.event(30, format::EventKind::skip, "non-finite loss at fp16; optimizer step skipped");
  writer.event(30, format::EventKind::first_birth, "nan at aten::log (forward) in module 'blocks.1.fc'");
  writer.event(30, format::EventKind::snapshot, dir + "/snapshots/step-0000030.h5");
  writer.event(40, format::EventKind::warning, "layer_grad_norm in 'blocks.1.fc': 41.2 against 1.3");
  writer.event(60, format::EventKind::rollback,
               format::rollback_text({40, 60, 0.5, 0.0005, "loss 1e+06 x 10 the largest healthy loss"}));
  writer.event(70, format::EventKind::skip, "non-finite loss at fp16; optimizer step skipped");
  writer.event(70, format::EventKind::snapshot, dir + "/snapshots/step-0000070.h5");
  writer.event(70, format::EventKind::fallback, "fp16 -> fp32, LR x 0.5");
  writer.event(70, format::EventKind::remedy, "whole: the model and optimizer state in fp32");
  writer.event(80, format::EventKind::save_refused, "checkpoint after step 80 not written: weight non-finite");
  writer.flush();
  // Step 30's birth made batch rows 1 and 2 non-finite; the step knew the data-set row of 1 only.
  test::write_synthetic_snapshot(dir + "/snapshots/step-0000030.h5", 30, 3, /*replayed=*/true, {1, 2}, {7, 3, -1, 5});
  test::write_synthetic_snapshot(dir + "/snapshots/step-0000070.h5", 70, 3, /*replayed=*/false);
}

size_t count_lines(const std::string& text) { return test::lines_of(text).size(); }

}  // namespace

TEST(Report, TextHasTheSummaryEverySectionAndTheSnapshots) {
  TempDir dir;
  const std::string run = dir.file("run");
  write_eventful_run(run);
  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string& out = r.output;
  EXPECT_TRUE(has_line(out, "run: " + run + "/run.h5")) << out;
  EXPECT_TRUE(
      has_line(out, "  file        " + run + "/run.h5 (format " + test::format_version_text() + ", origin cpp)"))
      << out;
  EXPECT_TRUE(has_line(out, "  config      model synthetic, amp fp16")) << out;
  EXPECT_TRUE(
      has_line(out, "  steps       100 recorded (steps 0-99): 78 counted, 2 skipped, 20 taken back by rollbacks"))
      << out;
  const std::string final_loss = number_text(5.0 * std::exp(-0.01 * 99) + 0.1);  // synthetic_row's curve
  EXPECT_TRUE(
      has_line(out, "  loss        final " + final_loss + " (step 99); last finite " + final_loss + " (step 99)"))
      << out;
  EXPECT_TRUE(has_line(out, "  amp         fp16 (steps 0-70), fp32 (steps 71-99); fp32 from step 71")) << out;
  EXPECT_TRUE(has_line(out, "  loss scale  32768 to 65536 over the fp16 steps")) << out;
  EXPECT_EQ(out.find("its writer still has it open"), std::string::npos) << out;

  EXPECT_TRUE(has_line(out, "skips (2)")) << out;
  EXPECT_TRUE(has_line(out, "  step 30  skip  non-finite loss at fp16; optimizer step skipped")) << out;
  EXPECT_TRUE(has_line(out, "  step 70  skip  non-finite loss at fp16; optimizer step skipped")) << out;
  EXPECT_TRUE(has_line(out, "first births (1)")) << out;
  EXPECT_TRUE(has_line(out, "  step 30  first_birth  nan at aten::log (forward) in module 'blocks.1.fc'")) << out;
  EXPECT_TRUE(has_line(out, "warnings (1)")) << out;
  EXPECT_TRUE(has_line(out, "  step 40  warning  layer_grad_norm in 'blocks.1.fc': 41.2 against 1.3")) << out;
  EXPECT_TRUE(has_line(out, "rollbacks (1)")) << out;
  EXPECT_TRUE(has_line(out,
                       "  step 60  rollback  to step 40: steps 41-60 do not count and their batches are skipped; LR x "
                       "0.5 -> 0.0005 (loss 1e+06 x 10 the largest healthy loss) [20 rows taken back]"))
      << out;
  EXPECT_TRUE(has_line(out, "fallbacks and remedies (2)")) << out;
  EXPECT_TRUE(has_line(out, "  step 70  fallback  fp16 -> fp32, LR x 0.5")) << out;
  EXPECT_TRUE(has_line(out, "  step 70  remedy  whole: the model and optimizer state in fp32")) << out;
  EXPECT_TRUE(has_line(out, "refused saves (1)")) << out;
  EXPECT_TRUE(has_line(
      out,
      "none: losses over nothing, dooming steps, loss scale backoffs, stop, resumes, ranks, events of unknown kinds"))
      << out;

  EXPECT_TRUE(has_line(out, "snapshots (2)")) << out;
  EXPECT_TRUE(has_line(out, "  step 30 (bf16): " + run + "/snapshots/step-0000030.h5")) << out;
  EXPECT_TRUE(has_line(out, "    first birth: nan at aten::log (forward) in module 'blocks.1.fc', batch rows 1, 2"))
      << out;
  EXPECT_TRUE(has_line(out, "    non-finite: batch row 1 (data set row 3), batch row 2 (data set row unknown)")) << out;
  EXPECT_TRUE(has_line(out,
                       "    replay: verdict model_or_data, category log_nonpositive; clamp the input of aten::log "
                       "in blocks.1.fc"))
      << out;
  EXPECT_TRUE(has_line(out, "  step 70 (bf16): " + run + "/snapshots/step-0000070.h5")) << out;
  EXPECT_TRUE(has_line(out, "    non-finite: batch row 2 (data set row 11)")) << out;
  EXPECT_TRUE(has_line(out, "    replay: not replayed yet (nanscope-replay " + run + "/snapshots/step-0000070.h5)"))
      << out;
  // Sections come in the order a failed run is read: what was skipped before what was done about it.
  EXPECT_LT(out.find("skips (2)"), out.find("first births (1)"));
  EXPECT_LT(out.find("rollbacks (1)"), out.find("fallbacks and remedies (2)"));
  EXPECT_LT(out.find("fallbacks and remedies (2)"), out.find("snapshots (2)"));

  // The run file given directly reads the same.
  const auto direct = report_tool(run + "/run.h5");
  EXPECT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_EQ(direct.output, out);
}

TEST(Report, JsonHasEveryCountEventAndSnapshot) {
  TempDir dir;
  const std::string run = dir.file("run");
  write_eventful_run(run);
  const std::string json = dir.file("report.json");
  const auto r = report_tool("--json " + run + " > " + json);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::python_json(json,
                              "len(d[\"runs\"]), d[\"runs\"][0][\"rank\"], d[\"runs\"][0][\"origin\"], "
                              "d[\"runs\"][0][\"config\"][\"model\"], d[\"runs\"][0][\"writer_open\"]"),
            "1 None cpp synthetic False\n");
  EXPECT_EQ(test::python_json(json,
                              "[d[\"runs\"][0][\"summary\"][k] for k in (\"rows\", \"first_step\", \"last_step\", "
                              "\"counted\", \"skipped\", \"rolled_back\", \"fp32_from_step\", \"loss_scale\")]"),
            "[100, 0, 99, 78, 2, 20, 71, {'min': 32768, 'max': 65536}]\n");
  EXPECT_EQ(test::python_json(json, "d[\"runs\"][0][\"summary\"][\"amp\"]"),
            "[{'precision': 'fp16', 'first_step': 0, 'last_step': 70}, "
            "{'precision': 'fp32', 'first_step': 71, 'last_step': 99}]\n");
  EXPECT_EQ(test::python_json(json,
                              "[d[\"runs\"][0][\"event_counts\"][k] for k in (\"skip\", \"first_birth\", \"warning\", "
                              "\"rollback\", \"fallback\", \"remedy\", \"save_refused\", \"snapshot\", \"stop\")], "
                              "len(d[\"runs\"][0][\"events\"]), d[\"runs\"][0][\"events\"][0]"),
            "[2, 1, 1, 1, 1, 1, 1, 2, 0] 10 {'step': 30, 'kind': 'skip', 'text': 'non-finite loss at fp16; optimizer "
            "step skipped'}\n");
  EXPECT_EQ(test::python_json(json,
                              "[(b[\"step\"], b[\"to_step\"], b[\"rows_taken_back\"]) for b in "
                              "d[\"runs\"][0][\"rollbacks\"]]"),
            "[(60, 40, 20)]\n");
  EXPECT_EQ(test::python_json(json,
                              "[(s[\"step\"], s[\"readable\"], s[\"first_birth\"][\"op\"], s[\"nonfinite_rows\"], "
                              "s[\"replay\"] and s[\"replay\"][\"verdict\"]) for s in d[\"runs\"][0][\"snapshots\"]]"),
            "[(30, True, 'aten::log', [{'batch_row': 1, 'dataset_row': 3}, {'batch_row': 2, 'dataset_row': None}], "
            "'model_or_data'), (70, True, 'aten::log', [{'batch_row': 2, 'dataset_row': 11}], None)]\n");
}

TEST(Report, LongSectionsShowTheirFirstEntriesAndACount) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  {
    format::RunWriter writer(run + "/run.h5", test::synthetic_header(2), 64);
    for (int64_t s = 0; s < 300; ++s) {
      format::StepRow row = test::synthetic_row(s, 2, s);  // every step non-finite
      writer.append(row);
      writer.event(s, format::EventKind::skip, "non-finite loss at bf16; optimizer step skipped");
    }
  }
  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "skips (300)")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  step 9  skip  non-finite loss at bf16; optimizer step skipped")) << r.output;
  EXPECT_FALSE(has_line(r.output, "  step 10  skip  non-finite loss at bf16; optimizer step skipped")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  ... and 290 more (--json lists every one)")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  steps       300 recorded (steps 0-299): 0 counted, 300 skipped")) << r.output;
  EXPECT_TRUE(has_line(r.output, "  loss        final nan (step 299); no finite loss on a step that counted"))
      << r.output;
  EXPECT_LT(count_lines(r.output), 40u) << r.output;

  const auto three = report_tool("--limit 3 " + run);
  EXPECT_TRUE(has_line(three.output, "  ... and 297 more (--json lists every one)")) << three.output;
  const auto all = report_tool("--limit 0 " + run);
  EXPECT_TRUE(has_line(all.output, "  step 299  skip  non-finite loss at bf16; optimizer step skipped")) << all.output;
  EXPECT_EQ(all.output.find("... and"), std::string::npos);

  const std::string json = dir.file("report.json");
  ASSERT_EQ(report_tool("--json " + run + " > " + json).exit_code, 0);
  EXPECT_EQ(test::python_json(json, "len(d[\"runs\"][0][\"events\"]), d[\"runs\"][0][\"summary\"][\"final_loss\"]"),
            "300 {'step': 299, 'loss': 'nan'}\n");
}

// A run killed at its first step wrote its config and events, no row.
TEST(Report, ARunWithNoStepRowSaysWhatItHolds) {
  TempDir dir;
  const std::string run = dir.file("run");
  std::filesystem::create_directories(run);
  {
    format::RunWriter writer(run + "/run.h5", test::synthetic_header(2), 64);
    writer.event(0, format::EventKind::skip, "non-finite loss at bf16; optimizer step skipped");
    writer.event(0, format::EventKind::first_birth, "nan at aten::log (forward) in module 'fc1'");
  }
  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("steps       none recorded: no step row was written"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("it holds its config (above) and 2 event(s) (below)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nan at aten::log (forward) in module 'fc1'"), std::string::npos) << r.output;
}

TEST(Report, SeveralRanksAreReportedRankByRank) {
  TempDir dir;
  const std::string run = dir.file("run");
  test::write_synthetic_rank_dir(run, 2, 50, 3, /*nan_rank=*/1, /*nan_step=*/20, "1");
  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t rank0 = r.output.find("rank 0: " + run + "/run-rank-0.h5\n");
  const size_t rank1 = r.output.find("rank 1: " + run + "/run-rank-1.h5\n");
  ASSERT_NE(rank0, std::string::npos) << r.output;
  ASSERT_NE(rank1, std::string::npos) << r.output;
  ASSERT_LT(rank0, rank1);
  const std::string first = r.output.substr(rank0, rank1 - rank0), second = r.output.substr(rank1);
  for (const std::string& section : {first, second}) {
    EXPECT_TRUE(has_line(section, "  step 20  skip  non-finite grads; step skipped")) << section;
    EXPECT_TRUE(has_line(section, "  step 20  first_nonfinite  1")) << section;
  }
  // Only rank 1 met the NaN: its birth and its snapshot are in its section alone.
  EXPECT_TRUE(has_line(first, "snapshots: none")) << first;
  EXPECT_EQ(first.find("first_birth"), std::string::npos) << first;
  EXPECT_TRUE(has_line(second, "  step 20  first_birth  nan at aten::log in 'blocks.1.fc' (forward)")) << second;
  EXPECT_TRUE(has_line(second, "  step 20 (bf16): " + run + "/snapshots/rank-1/step-0000020.h5")) << second;

  const std::string json = dir.file("report.json");
  ASSERT_EQ(report_tool("--json " + run + " > " + json).exit_code, 0);
  EXPECT_EQ(test::python_json(json,
                              "[(x[\"rank\"], x[\"config\"][\"world_size\"], len(x[\"snapshots\"])) for x in "
                              "d[\"runs\"]]"),
            "[(0, '2', 0), (1, '2', 1)]\n");

  // One rank's file on its own: that rank, its snapshots.
  const auto one = report_tool(run + "/run-rank-1.h5");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(has_line(one.output, "rank 1: " + run + "/run-rank-1.h5")) << one.output;
  EXPECT_TRUE(has_line(one.output, "snapshots (1)")) << one.output;
}

// A model of its own float16 weights trained with autocast off: its snapshot
// says fp32 (autocast's setting), and once replay has widened the weights for
// its fp32 re-run, the report names what the step computed in.
TEST(Report, ASnapshotOfAModelOfItsOwn16BitWeightsSaysItsType) {
  TempDir dir;
  const std::string run = dir.file("run");
  write_eventful_run(run);
  const std::string snapshot = run + "/snapshots/step-0000030.h5";
  {
    format::Archive archive = format::Archive::open(snapshot, format::kSnapshotFileKind, /*writable=*/true);
    format::Group root = archive.root();
    root.set_word("precision", format::Precision::fp32);
    format::ReplayRecord record = *format::read_replay_record(root);
    record.widened_weights = "float16";
    format::write_replay_record(root, record);
  }
  const auto text = report_tool(run);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(has_line(text.output, "  step 30 (float16, the model's own weights): " + snapshot)) << text.output;
  EXPECT_TRUE(has_line(text.output, "  step 70 (bf16): " + run + "/snapshots/step-0000070.h5")) << text.output;
  const std::string json = dir.file("report.json");
  ASSERT_EQ(report_tool("--json " + run + " > " + json).exit_code, 0);
  EXPECT_EQ(test::python_json(json,
                              "[(s[\"precision\"], s[\"replay\"] and s[\"replay\"][\"widened_weights\"]) "
                              "for s in d[\"runs\"][0][\"snapshots\"]]"),
            "[('fp32', 'float16'), ('bf16', None)]\n");
}

TEST(Report, AnUnreadableSnapshotIsListedNotFatal) {
  TempDir dir;
  const std::string run = dir.file("run");
  write_eventful_run(run);
  std::ofstream(run + "/snapshots/step-0000090.h5") << "half a snapshot";
  std::ofstream(run + "/snapshots/step-0000091.h5.tmp") << "still being written";
  const auto r = report_tool(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has_line(r.output, "snapshots (3)")) << r.output;
  EXPECT_TRUE(
      has_line(r.output, "  unreadable: '" + run + "/snapshots/step-0000090.h5': not an HDF5 file (no HDF5 signature)"))
      << r.output;
  EXPECT_EQ(r.output.find("step-0000091"), std::string::npos) << r.output;
}

TEST(Report, BadInputIsOneLineNamingTheFileAndExit2) {
  TempDir dir;
  auto expect_one_line = [](const test::CommandResult& r, const std::string& path, const std::string& what) {
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << r.output;
    EXPECT_EQ(r.output.rfind("nanscope-report: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find("'" + path + "'"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
  };
  const std::string missing = dir.file("no-such-run");
  expect_one_line(report_tool(missing), missing, "no such file or directory");
  expect_one_line(report_tool("--json " + missing), missing, "no such file or directory");

  const std::string empty = dir.file("empty");
  std::filesystem::create_directories(empty);
  expect_one_line(report_tool(empty), empty, "no run.h5 or run-rank-R.h5");

  const std::string text_run = dir.file("text-run");
  std::filesystem::create_directories(text_run);
  std::ofstream(text_run + "/run.h5") << "step,loss\n0,2.3\n";
  expect_one_line(report_tool(text_run), text_run + "/run.h5", "not an HDF5 file");
  expect_one_line(report_tool(text_run + "/run.h5"), text_run + "/run.h5", "not an HDF5 file");
  expect_one_line(report_tool("--json " + text_run), text_run + "/run.h5", "not an HDF5 file");

  // A nanscope file of another kind, and a cut-off run file.
  const std::string snapshot = dir.file("step-0000005.h5");
  test::write_synthetic_snapshot(snapshot, 5, 2, false);
  expect_one_line(report_tool(snapshot), snapshot, "nanscope-snapshot");
  const std::string cut = dir.file("cut/run.h5");
  std::filesystem::create_directories(dir.file("cut"));
  test::write_synthetic_run(dir.file("whole.h5"), 200, 4, 10);
  {
    std::ifstream whole(dir.file("whole.h5"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(whole)), {});
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  const auto truncated = report_tool(cut);
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_EQ(count_lines(truncated.output), 1u) << truncated.output;
  EXPECT_NE(truncated.output.find("'" + cut + "'"), std::string::npos) << truncated.output;

  // Usage errors are bad input too; --help is not.
  EXPECT_EQ(report_tool("").exit_code, 2);
  EXPECT_EQ(report_tool("--json --follow " + missing).exit_code, 2);
  EXPECT_EQ(report_tool("--help").exit_code, 0);
}

TEST(Report, OneRankUnreadableTheOthersAreStillReported) {
  TempDir dir;
  const std::string run = dir.file("run");
  test::write_synthetic_rank_dir(run, 2, 30, 2, 0, 10, "0");
  std::ofstream(run + "/run-rank-1.h5", std::ios::trunc) << "gone";
  const auto r = report_tool(run);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has_line(r.output, "  step 10  skip  non-finite grads; step skipped")) << r.output;
  EXPECT_TRUE(has_line(
      r.output, "nanscope-report: bad run file '" + run + "/run-rank-1.h5': not an HDF5 file (no HDF5 signature)"))
      << r.output;
}

TEST(Report, EveryEventKindHasExactlyOneSection) {
  for (size_t k = 0; k <= format::Words<format::EventKind>::count; ++k) {
    const auto kind = static_cast<format::EventKind>(k);
    int sections = 0;
    for (const report::EventSection& section : report::event_sections())
      sections += int(std::count(section.kinds.begin(), section.kinds.end(), kind));
    EXPECT_EQ(sections, 1) << format::to_string(kind);
  }
}

TEST(Report, BirthRowsMapToDataSetRowsOrSayUnknown) {
  format::SnapshotSummary s;
  s.batch_rows = {40, -1, 42};
  EXPECT_TRUE(report::birth_rows(s).empty());  // no birth, no rows
  format::Birth internal;
  internal.rows = {0, 1, 5};  // 5: more rows than the snapshot kept
  s.capture.first_birth = internal;
  const auto rows = report::birth_rows(s);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(report::birth_row_text(rows[0]), "batch row 0 (data set row 40)");
  EXPECT_EQ(report::birth_row_text(rows[1]), "batch row 1 (data set row unknown)");
  EXPECT_EQ(report::birth_row_text(rows[2]), "batch row 5 (data set row unknown)");
  format::Birth input;
  input.sample = 2;  // an input birth names its row as its sample
  s.capture.first_birth = input;
  ASSERT_EQ(report::birth_rows(s).size(), 1u);
  EXPECT_EQ(report::birth_row_text(report::birth_rows(s)[0]), "batch row 2 (data set row 42)");
}

TEST(Report, JsonWriterEscapesAndWritesNonFiniteNumbersAsStrings) {
  std::ostringstream out;
  report::JsonWriter json(out);
  json.begin_object();
  json.key("text").value("a \"quoted\" \\ line\nand a tab\t\x01");
  json.key("numbers").begin_array();
  json.value(0.1);
  json.value(double(NAN));
  json.value(-double(INFINITY));
  json.value(int64_t(-3));
  json.end_array();
  json.key("empty").begin_object();
  json.end_object();
  json.key("none").null();
  json.end_object();
  json.finish();
  EXPECT_EQ(out.str(),
            "{\n  \"text\": \"a \\\"quoted\\\" \\\\ line\\nand a tab\\t\\u0001\",\n  \"numbers\": [\n    0.1,\n"
            "    \"nan\",\n    \"-inf\",\n    -3\n  ],\n  \"empty\": {},\n  \"none\": null\n}\n");
}
