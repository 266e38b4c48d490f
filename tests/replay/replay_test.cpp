// nanscope-replay as a user runs it: verdicts for the fault catalog, the
// bisections, a snapshot replayed far from its run, and every bad input.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "../support/test_support.hpp"

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/precision_trail.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/snapshot.hpp"
#include "nanscope/replay/model_registry.hpp"
#include "nanscope/replay/verdict.hpp"

using namespace nanscope;
namespace fs = std::filesystem;

namespace {

const std::string kTrain = test::paths::train_exe;
const std::string kReplay = test::paths::replay_exe;

// Trains a catalog scenario into `run_dir` and returns its first snapshot.
std::string snapshot_of(const std::string& scenario, const std::string& run_dir, const std::string& extra = "",
                        int exit_code = kExitOk) {
  auto r = test::run_command(kTrain + " --config " + test::paths::samples + "/faults/" + scenario +
                             ".toml --quiet --threads 1 --run-dir " + run_dir + " " + extra);
  EXPECT_EQ(r.exit_code, exit_code) << r.output;
  std::vector<std::string> snapshots;
  for (const auto& entry : fs::directory_iterator(run_dir + "/snapshots")) snapshots.push_back(entry.path().string());
  std::sort(snapshots.begin(), snapshots.end());  // step-NNNNNNN: the first step first
  return snapshots.empty() ? "" : snapshots.front();
}

bool has(const std::string& json, const std::string& key, const std::string& value) {
  return json.find("\"" + key + "\": " + value) != std::string::npos;
}

// Writes the TorchScript fixtures (tests/fixtures/make_scripted_model.py) into
// `dir`, trains `model` on their regressor data for `steps` steps (plus
// `extra` flags) into dir/run and returns the snapshot of `snapshot_step`.
std::string scripted_snapshot(const test::TempDir& dir, const std::string& model, int steps, int snapshot_step,
                              const std::string& extra = "") {
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  EXPECT_EQ(fixture.exit_code, 0) << fixture.output;
  auto r = test::run_command(kTrain + " --model " + dir.file(model) + " --data " + dir.file("regressor_data.h5") +
                             " --steps " + std::to_string(steps) + " --batch-size 16 --quiet --threads 1 " + extra +
                             " --run-dir " + dir.file("run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return probe::snapshot_path(dir.file("run"), snapshot_step);
}

}  // namespace

// Outside the anonymous namespace: gtest derives the test class from it.
struct Expected {
  const char* scenario;
  const char* verdict;
  const char* category;
  const char* evidence;  // another fragment the JSON must hold, or nullptr
  bool needs_fp16;
  int exit_code = kExitOk;  // of the training run: a cause that persists kills it (4)
};

std::ostream& operator<<(std::ostream& os, const Expected& e) { return os << e.scenario; }

const Expected kVerdicts[] = {
    {"p08-log-nonpositive", "model_or_data", "log_nonpositive", "\"fp32_finite\": false", false},
    {"p08-sqrt-grad-zero", "model_or_data", "sqrt_grad_zero", "SqrtBackward0", false},
    {"p08-div-zero-variance", "model_or_data", "div_by_zero", nullptr, false},
    {"p08-exp-overflow", "model_or_data", "exp_overflow", nullptr, false},
    {"p10-bf16-cancellation", "precision", "div_by_zero", "\"fp32_modules\": [\"blocks.0.ln1\"]", false},
    {"p10-fp16-overflow", "precision", "overflow", "\"fp32_modules\": [\"blocks.0.mlp\"]", true},
    {"p11-corrupt-sample", "data", "nonfinite_input", "\"samples\": [3]", false},
    {"p12-lr-explosion", "model_or_data", "grad_explosion", "grad norm", false, kExitDeadRun},
    {"p15-logit-drift", "precision", "overflow", "\"fp32_modules\": [\"head\"",
     true},  // head, and what its scaled gradients overflow in fp16
    {"p16-attention-logit-growth", "precision", "overflow", "\"fp32_modules\": [\"blocks.0.attn\"]", true},
    {"masked-attention-row", "model_or_data", "fully_masked_softmax", nullptr, false},
};

class Verdicts : public ::testing::TestWithParam<Expected> {};

TEST_P(Verdicts, CatalogScenarioGetsItsVerdictAndCategory) {
  const Expected& e = GetParam();
  if (e.needs_fp16 && !compat::autocast_supported(c10::kCPU, at::kHalf))
    GTEST_SKIP() << "needs fp16 autocast (CUDA, or CPU with LibTorch 2.x)";
  test::TempDir dir;
  const std::string snapshot = snapshot_of(e.scenario, dir.file("run"), "", e.exit_code);
  auto r = test::run_command(kReplay + " --json " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "verdict", std::string("\"") + e.verdict + "\"")) << r.output;
  EXPECT_TRUE(has(r.output, "category", std::string("\"") + e.category + "\"")) << r.output;
  if (e.evidence) {
    EXPECT_NE(r.output.find(e.evidence), std::string::npos) << r.output;
  }
  EXPECT_TRUE(has(r.output, "reproduced", "true")) << r.output;
  // The result went into the snapshot for the viewer.
  const format::SnapshotSummary summary = format::read_snapshot_summary(snapshot);
  ASSERT_TRUE(summary.replay) << snapshot;
  EXPECT_EQ(std::string(format::to_string(summary.replay->verdict)), e.verdict);
  EXPECT_EQ(std::string(format::to_string(summary.replay->category)), e.category);
  EXPECT_GT(summary.replay->reproduced_count, 0);
  // A precision verdict says where precision was lost, op by op against
  // fp32, up to the birth; no other verdict has a trail.
  const std::optional<format::PrecisionTrail>& trail = summary.replay->precision_trail;
  ASSERT_EQ(trail.has_value(), std::string(e.verdict) == "precision") << r.output;
  if (!trail) return;
  ASSERT_FALSE(trail->ops.empty());
  EXPECT_GE(trail->first_lost, 0) << format::precision_lost_text(*trail);
  ASSERT_TRUE(summary.capture.first_birth);
  // It ends at the birth's op, or the outermost op around it (a linear around autocast's cast that overflowed).
  EXPECT_EQ(trail->ops.back().op.module, summary.capture.first_birth->op.module) << r.output;
  EXPECT_GT(trail->ops.back().nonfinite, 0) << r.output;
  EXPECT_TRUE(has(r.output, "first_lost_at", std::to_string(trail->first_lost))) << r.output;
}

// P10's layer norm computes its variance as E[x^2] - E[x]^2 with both terms
// held in bf16 (samples/models/src/fault_ops.cpp): the division by its square
// root is the birth, and the subtraction that cancelled to 0 is where
// precision was lost. The centring subtraction before it, in fp32 in both
// runs, is no loss, nor are the squares and means rounded to bf16.
TEST(Replay, APrecisionTrailNamesTheCancellingSubtractionNotTheDivisionItBreaks) {
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p10-bf16-cancellation", dir.file("run"));
  auto r = test::run_command(kReplay + " " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("precision lost:   aten::sub in module 'blocks.0.ln1' (forward): "), std::string::npos)
      << r.output;
  const format::SnapshotSummary summary = format::read_snapshot_summary(snapshot);
  ASSERT_TRUE(summary.replay && summary.replay->precision_trail) << r.output;
  const format::PrecisionTrail& t = *summary.replay->precision_trail;
  EXPECT_EQ(t.type, "bfloat16");
  ASSERT_GE(t.first_lost, 1);
  const format::OpError& lost = t.ops[size_t(t.first_lost)];
  EXPECT_EQ(lost.op.op, "aten::sub");
  EXPECT_EQ(lost.op.module, "blocks.0.ln1");
  EXPECT_GT(lost.ulps, t.margin_ulps);
  bool centred = false, rounded_mean = false;
  for (int64_t i = 0; i < t.first_lost; ++i) {
    const format::OpError& e = t.ops[size_t(i)];
    EXPECT_LE(e.ulps, t.margin_ulps) << format::op_error_text(e);
    if (e.op.module != "blocks.0.ln1") continue;
    centred |= e.op.op == "aten::sub";
    rounded_mean |= e.op.op == "aten::mean" && e.max_abs > 0;
  }
  EXPECT_TRUE(centred) << "the layer's first subtraction was compared and kept within rounding";
  EXPECT_TRUE(rounded_mean) << "E[x^2] rounded to bf16 differs from fp32's, within rounding";
  EXPECT_EQ(t.ops.back().op.op, "aten::div");
  EXPECT_GT(t.ops.back().nonfinite, 0);
  EXPECT_GT(t.unmatched, 0) << "the casts to bf16 that fp32 has not are stepped over";
  // nanscope-report says the same from the snapshot.
  auto report = test::run_command(std::string(test::paths::report_exe) + " " + dir.file("run"));
  EXPECT_NE(report.output.find("precision lost: aten::sub in module 'blocks.0.ln1'"), std::string::npos)
      << report.output;
}

INSTANTIATE_TEST_SUITE_P(SamplesFaults, Verdicts, ::testing::ValuesIn(kVerdicts), [](const auto& info) {
  std::string name = info.param.scenario;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
});

// A program whose main() takes `const char* argv[]` (pytorch/examples'
// cpp/dcgan) hands its arguments on as they are; a path that is no snapshot
// is bad input (exit 2), not a crash.
TEST(Replay, AProgramsConstArgvIsTakenAsItIs) {
  const char* argv[] = {"dcgan", "/nonexistent/step-0000030.h5", "--no-write"};
  EXPECT_EQ(replay::replay_main(3, argv), kExitBadInput);
}

namespace {

// A linear classifier plus 1e-3 / ((m + 1e-3) - m), m each row's largest
// |x|: in bfloat16 the 1e-3 is lost next to m >= 0.25 and the quotient is
// 1/0; in float32 it is about 1.
struct GapNetImpl : torch::nn::Module {
  GapNetImpl() : head(register_module("head", torch::nn::Linear(8, 4))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor top = x.abs().amax({1}, /*keepdim=*/true);
    return head->forward(x) + 1e-3 / ((top + 1e-3) - top);
  }
  torch::nn::Linear head;
};
TORCH_MODULE(GapNet);

}  // namespace

// A C++ program's model of its own bf16 weights, replayed by the program
// itself: autocast off leaves it computing in bf16, so the fp32 re-run widens
// its weights and batch, finds the step finite (precision, not "non-finite
// in fp32 too"), and puts the weights back to bf16.
TEST(Replay, AProgramsModelOfItsOwnBf16WeightsIsReRunInFp32WidenedAndPutBack) {
  test::TempDir dir;
  torch::manual_seed(0);
  GapNet net;
  net->to(at::kBFloat16);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  std::ostringstream log;
  GuardOptions o{dir.file("run"), Amp::fp32};
  o.log = &log;
  auto loss = [&](const Batch& b) {
    return torch::nn::functional::cross_entropy(net->forward(b.inputs).to(at::kFloat), b.targets);
  };
  std::string snapshot;
  {
    StepGuard guard(net, optimizer, o);
    for (int step = 0; step < 3; ++step) {
      at::Tensor x = 0.01 * torch::randn({16, 8}), y = torch::randint(0, 4, {16}, at::kLong);
      if (step == 1) x.select(1, 0).fill_(2.0);  // 2 + 1e-3 is 2 in bfloat16: every row's quotient is 1/0
      const Batch batch{x.to(at::kBFloat16), y};
      const GuardedStep result = guard.closure_step([&] { return loss(batch); }, batch);
      EXPECT_EQ(result.counted(), step != 1) << log.str();
      if (step == 1) snapshot = result.snapshot;
    }
    EXPECT_NE(log.str().find("non-finite loss at bfloat16"), std::string::npos) << log.str();
  }
  ASSERT_FALSE(snapshot.empty()) << log.str();
  // The guard wrote what the step computed in: the viewer and report say it before any replay.
  EXPECT_EQ(format::step_precision_text(format::read_snapshot_summary(snapshot)), "bfloat16, the model's own weights");
  const char* argv[] = {"program", snapshot.c_str(), "--no-write"};
  testing::internal::CaptureStdout();
  const int code = replay::replay_main(3, argv, *net, loss);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, kExitOk) << out;
  EXPECT_NE(out.find("re-run in fp32:   finite (its bfloat16 weights widened to float32)"), std::string::npos) << out;
  EXPECT_NE(out.find("verdict:    precision"), std::string::npos) << out;
  EXPECT_EQ(net->head->weight.scalar_type(), at::kBFloat16);

  // Written into the snapshot, the record says so too (the viewer's replay box reads it).
  const char* write_argv[] = {"program", snapshot.c_str()};
  testing::internal::CaptureStdout();
  EXPECT_EQ(replay::replay_main(2, write_argv, *net, loss), kExitOk);
  testing::internal::GetCapturedStdout();
  const format::SnapshotSummary summary = format::read_snapshot_summary(snapshot);
  ASSERT_TRUE(summary.replay);
  EXPECT_EQ(summary.replay->widened_weights, "bfloat16");
  EXPECT_TRUE(summary.replay->fp32_finite);
}

TEST(Replay, SnapshotCopiedAwayReplaysWithoutTheModelOrDataFiles) {
  test::TempDir dir;
  const std::string snapshot = scripted_snapshot(dir, "regressor.pt", 8, 5, "--fault nonfinite_input@5:9");
  fs::create_directories(dir.file("elsewhere"));
  const std::string copy = dir.file("elsewhere/step.h5");
  fs::copy_file(snapshot, copy);
  fs::remove_all(dir.file("run"));
  fs::remove(dir.file("regressor.pt"));
  fs::remove(dir.file("regressor_data.h5"));
  auto replay = test::run_command(kReplay + " --json " + copy);
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_TRUE(has(replay.output, "verdict", "\"data\"")) << replay.output;
  EXPECT_TRUE(has(replay.output, "sample", "9")) << replay.output;
  EXPECT_TRUE(has(replay.output, "draws_random_numbers", "false")) << replay.output;
}

TEST(Replay, InspectShowsWhatATorchScriptSnapshotWouldRunWithoutRunningIt) {
  test::TempDir dir;
  const std::string snapshot = scripted_snapshot(dir, "regressor.pt", 8, 5, "--fault nonfinite_input@5:9");
  auto text = test::run_command(kReplay + " --inspect " + snapshot);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("TorchScript program of"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("source you trust"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("encoder.0.weight  float32 [32, 6]"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("inputs  float32 [16, 6]"), std::string::npos) << text.output;
  auto json = test::run_command(kReplay + " --inspect --json " + snapshot);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "carries_code", "true")) << json.output;
  EXPECT_TRUE(has(json.output, "program_error", "null")) << json.output;
  EXPECT_NE(json.output.find("\"program_files\": [\"code/__torch__"), std::string::npos) << json.output;
  // The program is listed from its archive, not loaded: a program that no
  // TorchScript loader accepts is still inspected (its files' listing fails,
  // said so), while replaying it fails.
  {
    auto archive = format::Archive::open(snapshot, format::kSnapshotFileKind, true);
    const std::string junk = "PK this is no TorchScript program";
    archive.root().group("model").remove("torchscript");
    archive.root().group("model").put_blob("torchscript", junk.data(), junk.size());
    archive.close();
  }
  auto junk = test::run_command(kReplay + " --inspect --json " + snapshot);
  ASSERT_EQ(junk.exit_code, 0) << junk.output;
  EXPECT_TRUE(has(junk.output, "program_bytes", "33")) << junk.output;
  EXPECT_FALSE(has(junk.output, "program_error", "null")) << junk.output;
  EXPECT_NE(test::run_command(kReplay + " --no-write " + snapshot).exit_code, 0);
}

TEST(Replay, InspectSaysABuiltInModelsSnapshotCarriesNoCode) {
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-log-nonpositive", dir.file("run"));
  auto json = test::run_command(kReplay + " --inspect --json " + snapshot);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "carries_code", "false")) << json.output;
  EXPECT_TRUE(has(json.output, "program_bytes", "0")) << json.output;
  EXPECT_NE(json.output.find("replaying runs no code from the file"), std::string::npos) << json.output;
  const format::SnapshotSummary summary = format::read_snapshot_summary(snapshot);
  EXPECT_FALSE(summary.replay) << "inspecting wrote into the snapshot";
  auto help = test::run_command(kReplay + " --help");
  EXPECT_NE(help.output.find("replay only snapshots from a source you trust"), std::string::npos) << help.output;
}

TEST(Replay, BatchBisectionOfAModelThatSamplesReplacesRowsInsteadOfRemovingThem) {
  // randn_like draws one number per sample: without a sample every later draw
  // shifts, and each removal would "fix" the step by luck. Each row is
  // replaced by a copy of another instead: every draw stays.
  test::TempDir dir;
  const std::string snapshot = scripted_snapshot(dir, "sampler.pt", 1, 0);
  auto json = test::run_command(kReplay + " --json --no-write " + snapshot);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "op", "\"aten::log\"")) << json.output;
  EXPECT_TRUE(has(json.output, "draws_random_numbers", "true")) << json.output;
  EXPECT_FALSE(has(json.output, "batch_bisection", "null")) << json.output;
  auto text = test::run_command(kReplay + " --no-write " + snapshot);
  EXPECT_NE(text.output.find("batch bisection:  each row replaced by a copy of another, not removed"),
            std::string::npos)
      << text.output;
}

TEST(Replay, StepWhoseOpRaisedOnTheNanReplaysAndQuotesTheError) {
  test::TempDir dir;
  auto json = test::run_command(kReplay + " --json --no-write " + scripted_snapshot(dir, "raises_after_nan.pt", 1, 0));
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "verdict", "\"model_or_data\"")) << json.output;
  EXPECT_TRUE(has(json.output, "category", "\"log_nonpositive\"")) << json.output;
  EXPECT_TRUE(has(json.output, "module", "\"enc\"")) << json.output;
  EXPECT_NE(json.output.find("\"rerun_error\": \"RuntimeError: all elements of input should be between 0 and 1"),
            std::string::npos)
      << json.output;
}

TEST(Replay, ABatchWhoseEveryTargetIsIgnoredIsTheDataNotThePrecision) {
  // cross_entropy(ignore_index=-1) over a padding-only batch: 0 / 0 at the
  // loss with every input finite. The capture counts the targets the loss
  // counted (none), and the verdict names the batch and the fix.
  test::TempDir dir;
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  auto train = test::run_command(kTrain + " --model " + dir.file("padded_classifier.pt") + " --data " +
                                 dir.file("padded_data.h5") + " --steps 4 --batch-size 16 --no-shuffle --amp bf16" +
                                 " --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(train.exit_code, 0) << train.output;
  auto json = test::run_command(kReplay + " --json --no-write " + probe::snapshot_path(dir.file("run"), 2));
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "op", "\"aten::cross_entropy_loss\"")) << json.output;
  EXPECT_TRUE(has(json.output, "kind", "\"nan\"")) << json.output;
  EXPECT_TRUE(has(json.output, "verdict", "\"data\"")) << json.output;
  EXPECT_TRUE(has(json.output, "category", "\"all_targets_ignored\"")) << json.output;
  EXPECT_NE(json.output.find("ignore_index"), std::string::npos) << json.output;
  EXPECT_NE(json.output.find("clamped to at least 1"), std::string::npos) << json.output;
}

TEST(Replay, TheReportKeepsNoEmptyPromise) {
  // Anomaly mode says "Traceback of forward call that caused the error:" and,
  // from C++, gives none: the report names the node's forward op and module.
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-sqrt-grad-zero", dir.file("run"));
  auto text = test::run_command(kReplay + " --no-write " + snapshot);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_EQ(text.output.find("Traceback of forward call"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("Error detected in SqrtBackward0. It is the backward of aten::sqrt in module "
                             "'blocks.0.attn'."),
            std::string::npos)
      << text.output;
  EXPECT_EQ(text.output.find("fp32 first birth: none\n"), std::string::npos) << text.output;
}

TEST(Replay, StepThatDoesNotReproduceIsTransient) {
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-log-nonpositive", dir.file("run"));
  {
    // The same snapshot without the planted fault: its re-runs are all finite.
    auto archive = format::Archive::open(snapshot, format::kSnapshotFileKind, true);
    archive.root().group("config").set_attr("faults", std::string(""));
    archive.close();
  }
  auto r = test::run_command(kReplay + " --json --repeats 4 " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "verdict", "\"transient\"")) << r.output;
  EXPECT_TRUE(has(r.output, "reproduced_count", "0")) << r.output;
  EXPECT_TRUE(has(r.output, "repeats", "4")) << r.output;
}

TEST(Replay, ReportForPeopleNamesTheBirthAndTheFix) {
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-sqrt-grad-zero", dir.file("run"));
  auto r = test::run_command(kReplay + " " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("first birth:      inf at aten::div (backward, in SqrtBackward0 of aten::sqrt) in module "
                          "'blocks.0.attn'"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("add eps inside the sqrt in blocks.0.attn ((x + 1e-12).sqrt())"), std::string::npos)
      << r.output;
}

namespace {

// Rewrites a snapshot as another loop would have written it: `origin`, the
// first birth's batch rows, and the batch's data set rows.
void restamp(const std::string& snapshot, const std::string& origin, const std::vector<int64_t>& birth_rows = {},
             const std::vector<int64_t>& batch_rows = {}) {
  auto archive = format::Archive::open(snapshot, format::kSnapshotFileKind, /*writable=*/true);
  format::Group root = archive.root();
  root.set_attr("origin", origin);
  if (!birth_rows.empty()) {
    format::Capture capture = format::read_capture(root.group("capture"));
    capture.first_birth->rows = birth_rows;
    root.remove("capture");
    format::write_capture(root.group("capture"), capture);
  }
  if (!batch_rows.empty()) {
    format::Group batch = root.group("batch");
    batch.remove("rows");
    batch.put_tensor("rows", format::DType::int64, {int64_t(batch_rows.size())}, batch_rows.data());
  }
  archive.close();
}

}  // namespace

TEST(Replay, TheSuggestionIsWordedForWhoeverRanTheLoop) {
  // The same corrupt sample, reported to a C++ loop and to a Python one: the
  // check at the data boundary in the user's own language.
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p11-corrupt-sample", dir.file("run"));
  restamp(snapshot, "cpp");
  auto cpp = test::run_command(kReplay + " --no-write --no-bisect " + snapshot);
  ASSERT_EQ(cpp.exit_code, 0) << cpp.output;
  EXPECT_NE(cpp.output.find("TORCH_CHECK(torch::isfinite(x).all().item<bool>()"), std::string::npos) << cpp.output;
  restamp(snapshot, "python");
  auto python = test::run_command(kReplay + " --no-write --no-bisect " + snapshot);
  ASSERT_EQ(python.exit_code, 0) << python.output;
  EXPECT_NE(python.output.find("assert torch.isfinite(x).all()"), std::string::npos) << python.output;
  EXPECT_EQ(python.output.find("TORCH_CHECK"), std::string::npos) << python.output;
}

TEST(Replay, TheFp32ModulesAreNamedAsThePythonModuleTakesThem) {
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p10-bf16-cancellation", dir.file("run"));
  restamp(snapshot, "python");
  auto r = test::run_command(kReplay + " --no-write " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("use nanscope.GuardConfig(fp32_modules=[\"blocks.0.ln1\"])"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("nanscope.GuardConfig(fallback=\"auto\")"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--fp32-modules"), std::string::npos) << r.output;
  // The divisor is a square root of a variance: the eps goes under the root.
  EXPECT_NE(r.output.find("comes from aten::sqrt"), std::string::npos) << r.output;
}

TEST(Replay, ALogOfAnActivationIsToldToClampItNotToUseLogSoftmax) {
  // log(gelu(x)): the trail shows the log's input came from gelu, not from a
  // softmax, so log_softmax is no fix for it.
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-log-nonpositive", dir.file("run"));
  auto r = test::run_command(kReplay + " --no-write --no-bisect " + snapshot);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the input of aten::log in blocks.0.mlp (the output of aten::gelu) went down to -"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("x.clamp_min(1e-7).log()"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("log_softmax"), std::string::npos) << r.output;
}

TEST(Replay, TheBirthsRowsAreReportedWithTheirDataSetRowsOrUnknown) {
  // A loop that gave no data set rows (-1 each) and a birth that made batch
  // row 3 non-finite: the report names the row and says its data set row is
  // unknown, in the text and the JSON (null), and never prints -1.
  test::TempDir dir;
  const std::string snapshot = snapshot_of("p08-log-nonpositive", dir.file("run"));
  restamp(snapshot, "cpp", {3}, std::vector<int64_t>(8, -1));
  auto text = test::run_command(kReplay + " --no-write --no-bisect " + snapshot);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("rows at birth:    batch row 3 (data set row unknown)"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("aten::log made only batch row 3 (data set row unknown) of 8 non-finite"),
            std::string::npos)
      << text.output;
  EXPECT_EQ(text.output.find("row -1"), std::string::npos) << text.output;
  auto json = test::run_command(kReplay + " --json --no-write --no-bisect " + snapshot);
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_TRUE(has(json.output, "rows", "[3]")) << json.output;
  EXPECT_TRUE(has(json.output, "dataset_rows", "[null]")) << json.output;
}

namespace {

// Replaying and inspecting alike: exit 2, the file and what is wrong named.
void expect_bad_input(const std::string& path, const std::string& what) {
  for (const char* flags : {"", "--inspect "}) {
    auto r = test::run_command(kReplay + " " + flags + path);
    EXPECT_EQ(r.exit_code, 2) << flags << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("HDF5-DIAG"), std::string::npos) << "HDF5's own error stack leaked:\n" << r.output;
  }
}

}  // namespace

TEST(Replay, EveryKindOfBadInputExitsTwoNamingTheFile) {
  test::TempDir dir;
  expect_bad_input(dir.file("missing.h5"), "no such file");
  std::ofstream(dir.file("empty.h5")).close();
  expect_bad_input(dir.file("empty.h5"), "file is empty");
  std::ofstream(dir.file("text.h5")) << "this is not a snapshot";
  expect_bad_input(dir.file("text.h5"), "not an HDF5 file");

  const std::string real = snapshot_of("p08-log-nonpositive", dir.file("run"));
  fs::copy_file(real, dir.file("truncated.h5"));
  fs::resize_file(dir.file("truncated.h5"), fs::file_size(real) / 3);
  expect_bad_input(dir.file("truncated.h5"), "");
  fs::copy_file(real, dir.file("corrupt.h5"));
  {
    std::fstream f(dir.file("corrupt.h5"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);
    for (int i = 0; i < 20000; ++i) f.put(char(i * 31 + 7));
  }
  expect_bad_input(dir.file("corrupt.h5"), "");
  expect_bad_input(dir.file("run/run.h5"), "is a 'nanscope-run' file, expected nanscope-snapshot");
  fs::copy_file(real, dir.file("newer.h5"));
  {
    auto archive = format::Archive::open(dir.file("newer.h5"), format::kSnapshotFileKind, true);
    archive.root().set_attr("format_version", std::string("2.0"));
    archive.close();
  }
  expect_bad_input(dir.file("newer.h5"), "format_version 2.0 is not supported");
  fs::copy_file(real, dir.file("no-capture.h5"));
  {
    auto archive = format::Archive::open(dir.file("no-capture.h5"), format::kSnapshotFileKind, true);
    archive.root().remove("capture");
    archive.close();
  }
  expect_bad_input(dir.file("no-capture.h5"), "/capture missing");
  auto usage = test::run_command(kReplay);
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
}

// A snapshot whose flipped bits crash HDF5 1.10.8 itself (a SIGSEGV in
// H5Aiterate2 -> H5A__close, found by mutating snapshots): the read rehearsed
// in a child process (the same read, rehearsed) takes the crash, and replay says "corrupt" and exits 2.
TEST(Replay, ASnapshotThatCrashesHdf5IsBadInputNotACrash) {
  const std::string crasher = std::string(test::paths::fuzz_crashers) + "/snapshot/h5aiterate-h5a-close.h5";
  auto r = test::run_command(kReplay + " " + crasher + " --json --no-write");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // HDF5 1.10 (bookworm) crashes on it, which the rehearsal reports; newer
  // HDF5 (trixie's 1.14) refuses it with an error of its own.
  EXPECT_TRUE(r.output.find("is corrupt: reading it crashed the HDF5 library") != std::string::npos ||
              r.output.find("cannot") != std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("h5aiterate-h5a-close.h5"), std::string::npos) << r.output;
}

TEST(VerdictRules, CategoryFollowsTheBirth) {
  format::Birth b;
  b.kind = format::BirthKind::nan;
  b.op.phase = format::Phase::forward;
  b.op.op = "aten::log_";
  EXPECT_EQ(replay::category_of(b), format::Category::log_nonpositive);
  b.op.op = "aten::_softmax";
  EXPECT_EQ(replay::category_of(b), format::Category::fully_masked_softmax);
  // log_softmax takes logits: nothing "non-positive" to clamp. Its NaN is a
  // fully masked row as softmax's is; its infinity, logits past the range.
  b.op.op = "aten::log_softmax";
  EXPECT_EQ(replay::category_of(b), format::Category::fully_masked_softmax);
  b.kind = format::BirthKind::inf;
  b.op.op = "aten::_log_softmax";
  EXPECT_EQ(replay::category_of(b), format::Category::overflow);
  b.kind = format::BirthKind::nan;
  b.op.op = "aten::div";
  EXPECT_EQ(replay::category_of(b), format::Category::div_by_zero);
  b.kind = format::BirthKind::inf;
  b.op.op = "aten::addmm";
  EXPECT_EQ(replay::category_of(b), format::Category::overflow);
  b.op.op = "aten::exp";
  EXPECT_EQ(replay::category_of(b), format::Category::exp_overflow);
  b.op.phase = format::Phase::backward;
  b.op.backward_node = "SqrtBackward0";
  b.op.op = "aten::div";
  EXPECT_EQ(replay::category_of(b), format::Category::sqrt_grad_zero);
  b.op.phase = format::Phase::grad_norm;
  b.op.backward_node = "";
  EXPECT_EQ(replay::category_of(b), format::Category::grad_explosion);
  b.op.phase = format::Phase::input;
  EXPECT_EQ(replay::category_of(b), format::Category::nonfinite_input);
  b.op.phase = format::Phase::forward;
  b.kind = format::BirthKind::nan;
  b.op.op = "aten::where";
  EXPECT_EQ(replay::category_of(b), format::Category::other);
}

// The re-runs are evidence of their own: a step non-finite every time is never
// "transient", even when the capture saw no op make the values (a compiled or
// fused kernel) or the snapshot holds no birth.
TEST(VerdictRules, AStepNonFiniteOnEveryReRunIsNeverTransientWithOrWithoutABirth) {
  replay::VerdictInputs in;
  in.repeats = 3;
  in.reproduced = 3;
  in.fp32_finite = false;
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::model_or_data);
  EXPECT_NE(v.suggestion.find("non-finite in 3 of 3 re-runs"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("where op-level capture cannot see"), std::string::npos) << v.suggestion;
  in.fp32_finite = true;
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::precision);
  in.rerun_error = "RuntimeError: all elements of input should be between 0 and 1";
  EXPECT_NE(replay::decide(in).suggestion.find("the re-run raised before one did"), std::string::npos);
  in.reproduced = 0;
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::transient);
}

// A compiled model: non-finite compiled on every re-run, finite when the same
// step runs eagerly. The compiler's verdict, with the module the search
// named as the fix; non-finite eagerly too is the model's own math.
TEST(VerdictRules, NonFiniteCompiledAndFiniteEagerIsTheCompilersWithTheRegionAsTheFix) {
  replay::VerdictInputs in;
  in.repeats = 3;
  in.reproduced = 3;
  in.fp32_finite = true;
  in.origin = format::Origin::python;
  in.eager_finite = true;
  in.compiled_region = "blocks.1.mlp";
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::compiler);
  EXPECT_EQ(v.category, format::Category::compiled_program);
  EXPECT_NE(v.suggestion.find("non-finite in 3 of 3 compiled re-runs and finite when the same step runs eagerly"),
            std::string::npos)
      << v.suggestion;
  EXPECT_NE(v.suggestion.find("model.get_submodule('blocks.1.mlp'); sub.forward = torch.compiler.disable"),
            std::string::npos)
      << v.suggestion;
  in.compiled_region = "";
  EXPECT_NE(replay::decide(in).suggestion.find("only the whole model compiled together"), std::string::npos);
  in.eager_finite = false;  // the model's math, whatever the program
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::precision);
  in.eager_finite = true;
  in.reproduced = 0;  // not even compiled: a fluke
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::transient);
}

TEST(VerdictRules, NotReproducedIsTransientAndFiniteInFp32IsPrecision) {
  replay::VerdictInputs in;
  format::Birth b;
  b.kind = format::BirthKind::inf;
  b.op.op = "aten::mul";
  b.op.phase = format::Phase::forward;
  b.op.module = "blocks.0.mlp";
  in.birth = b;
  in.repeats = 3;
  in.reproduced = 0;
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::transient);
  in.reproduced = 3;
  in.fp32_finite = true;
  in.precision = format::Precision::fp16;
  in.fp32_modules = {"blocks.0.mlp"};
  in.fp32_search = replay::Fp32Search::found;
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::precision);
  EXPECT_NE(v.suggestion.find("keep blocks.0.mlp in fp32"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("bf16 instead of fp16"), std::string::npos) << v.suggestion;
  in.fp32_finite = false;
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::model_or_data);
}

namespace {

format::Birth birth_at(const char* op, const char* kind, std::vector<format::TensorStats> inputs = {}) {
  format::Birth b;
  b.kind = format::from_string_or_unknown<format::BirthKind>(kind);
  b.op.op = op;
  b.op.phase = format::Phase::forward;
  b.op.module = "attn";
  b.inputs = std::move(inputs);
  return b;
}

format::TensorStats stats(double min, double max, int64_t inf_count = 0) {
  format::TensorStats t;
  t.min = min;
  t.max = max;
  t.absmax = std::max(std::fabs(min), std::fabs(max));
  t.inf_count = inf_count;
  return t;
}

}  // namespace

// Weights that held the NaN/Inf as the step began: no op of the step is the
// birth, whatever a re-run or the batch would say; the fix is the update
// before, and the way to name it is said in the loop's own words unless the
// run's search already has.
TEST(VerdictRules, WeightsThatHeldTheNanAreTheVerdictBeforeAnyReRunOrBatch) {
  replay::VerdictInputs in;
  in.nonfinite_weights = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  in.birth = birth_at("input", "nan");
  in.birth->op.phase = format::Phase::input;
  in.origin = format::Origin::cpp;
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::model_or_data);
  EXPECT_EQ(v.category, format::Category::nonfinite_weights);
  EXPECT_NE(v.suggestion.find("(parameter fc1.weight, parameter fc1.bias, parameter fc2.weight and 1 more)"),
            std::string::npos)
      << v.suggestion;
  EXPECT_NE(v.suggestion.find("set GuardOptions::doom_search.enabled = true"), std::string::npos) << v.suggestion;
  in.doom_search_on = true;
  v = replay::decide(in);
  EXPECT_EQ(v.suggestion.find("doom_search"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("named none for this step"), std::string::npos) << v.suggestion;
  in.doom_search_answered = true;
  EXPECT_NE(replay::decide(in).suggestion.find("says what it found"), std::string::npos);
  in.nonfinite_weights.clear();
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::data);  // the batch's own NaN again
}

TEST(VerdictRules, AMatmulWhoseProductsPassTheRangeIsAnOverflowWhetherItGaveInfOrNan) {
  // q @ k^T over a 3e38 sentinel: each product overflows, and the sum is inf,
  // or NaN where signs mix (inf - inf), by how the CPU's kernel adds. The
  // same evidence gets the same category either way.
  for (const char* kind : {"inf", "nan"}) {
    format::Birth b = birth_at("aten::bmm", kind, {stats(-4e36, 3e37), stats(-2e37, 1e37)});
    b.op.output.dtype = "BFloat16";
    EXPECT_EQ(replay::category_of(b), format::Category::overflow) << kind;
  }
  // Products inside the range: a NaN there came from elsewhere.
  format::Birth modest = birth_at("aten::bmm", "nan", {stats(-4, 3), stats(-2, 1)});
  modest.op.output.dtype = "Float";
  EXPECT_EQ(replay::category_of(modest), format::Category::other);
  // fp16's range is 65504: 300 x 300 passes it.
  format::Birth half = birth_at("aten::mm", "nan", {stats(-300, 300), stats(-300, 300)});
  half.op.output.dtype = "Half";
  EXPECT_EQ(replay::category_of(half), format::Category::overflow);
}

TEST(VerdictRules, AGradNormRiseAddsItsAdviceOnlyWhereTheFixHasNotGivenIt) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::addmm", "inf", {stats(-1, 1), stats(-2, 2)});
  in.repeats = in.reproduced = 3;
  in.precision = format::Precision::bf16;
  in.grad_norm_trend = "run.h5: grad norm 1 at step 3 -> 1e+06 at step 12 (x1e+06) before this step";
  const std::string advice = "lengthen warmup or lower the LR";
  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t at = s.find(advice); at != std::string::npos; at = s.find(advice, at + 1)) ++n;
    return n;
  };
  replay::Verdict v = replay::decide(in);  // fp32 non-finite after a rise: grad_explosion
  EXPECT_EQ(v.category, format::Category::grad_explosion);
  EXPECT_EQ(count(v.suggestion), 1u) << v.suggestion;
  in.fp32_finite = true;  // precision: the fix says nothing of the LR, the rise does
  v = replay::decide(in);
  EXPECT_EQ(count(v.suggestion), 1u) << v.suggestion;
}

TEST(VerdictRules, LogOfExactlyZeroIsLogNonpositiveNotOverflow) {
  // A bf16 sigmoid rounded to 1.0 inside a hand-written BCE: log(1 - p) = -inf.
  replay::VerdictInputs in;
  in.birth = birth_at("aten::log", "inf", {stats(0, 0.5)});
  in.repeats = in.reproduced = 3;
  in.precision = format::Precision::bf16;
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.category, format::Category::log_nonpositive);
  EXPECT_EQ(v.suggestion.find("instead of fp16"), std::string::npos) << v.suggestion;
}

TEST(VerdictRules, DivisionOfInfinitiesPointsUpstreamNotAtTheDivisor) {
  // exp(x) / exp(x).sum() without max subtraction: inf / inf = NaN at div.
  replay::VerdictInputs in;
  in.birth = birth_at("aten::div", "nan", {stats(0, 3, 2), stats(1, 9, 4)});
  in.repeats = in.reproduced = 3;
  in.precision = format::Precision::fp32;
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.category, format::Category::overflow);
  EXPECT_EQ(v.suggestion.find("eps to the divisor"), std::string::npos) << v.suggestion;
  EXPECT_EQ(v.suggestion.find("instead of fp16"), std::string::npos) << v.suggestion;

  in.birth = birth_at("aten::div", "nan", {stats(-1, 1), stats(0, 0)});  // 0 / 0
  EXPECT_EQ(replay::decide(in).category, format::Category::div_by_zero);
  in.birth = birth_at("aten::div", "inf", {stats(1e30, 3e38), stats(1e-9, 1e-8)});  // finite, divisor > 0
  EXPECT_EQ(replay::decide(in).category, format::Category::overflow);
}

TEST(VerdictRules, PrecisionAdviceNamesOnlyWhatBisectionFound) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::mul", "inf");
  in.repeats = in.reproduced = 3;
  in.fp32_finite = true;
  in.precision = format::Precision::bf16;
  for (auto search : {replay::Fp32Search::none_found, replay::Fp32Search::unsupported, replay::Fp32Search::not_run}) {
    in.fp32_search = search;
    replay::Verdict v = replay::decide(in);
    EXPECT_EQ(v.verdict, format::Verdict::precision);
    EXPECT_EQ(v.suggestion.find("keep attn in fp32"), std::string::npos) << v.suggestion;
    EXPECT_EQ(v.suggestion.find("fp32 around attn"), std::string::npos) << v.suggestion;
    EXPECT_EQ(v.suggestion.find("instead of fp16"), std::string::npos) << v.suggestion;
  }
  in.fp32_search = replay::Fp32Search::unsupported;
  EXPECT_NE(replay::decide(in).suggestion.find("TorchScript"), std::string::npos);
}

// A model of its own float16 weights, autocast off: the fp32 re-run widened
// them, so the advice is about those weights, and the range that overflowed is float16's.
TEST(VerdictRules, AModelOfItsOwnFloat16WeightsIsToldItsWeightsAndFloat16sRange) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::mul", "inf");
  in.repeats = in.reproduced = 3;
  in.fp32_finite = true;
  in.precision = format::Precision::fp32;
  in.own_16bit = "float16";
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::precision);
  EXPECT_NE(v.suggestion.find("the model's own float16 weights are the cause"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("range of fp16"), std::string::npos) << v.suggestion;
  EXPECT_EQ(v.suggestion.find("range of fp32"), std::string::npos) << v.suggestion;
  in.fp32_finite = false;  // finite nowhere, float32 weights included: fp32's range
  v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::model_or_data);
  EXPECT_NE(v.suggestion.find("range of fp32"), std::string::npos) << v.suggestion;

  // Under bf16 autocast the fp32 re-run widened the weights and turned autocast
  // off: the weights alone are the cause only if widening them alone was finite.
  in.fp32_finite = true;
  in.precision = format::Precision::bf16;
  in.own_16bit = "bfloat16";
  in.widened_finite_at_amp = true;
  v = replay::decide(in);
  EXPECT_NE(v.suggestion.find("finite under its bf16 autocast too"), std::string::npos) << v.suggestion;
  in.widened_finite_at_amp = false;
  v = replay::decide(in);
  EXPECT_EQ(v.suggestion.find("are the cause"), std::string::npos) << v.suggestion;
  EXPECT_NE(v.suggestion.find("still non-finite"), std::string::npos) << v.suggestion;
}

namespace {

format::OpRecord trail_op(int64_t index, const char* op, format::TensorStats output) {
  format::OpRecord r;
  r.index = index;
  r.op = op;
  r.module = "attn";
  r.output = std::move(output);
  return r;
}

replay::VerdictInputs log_of(const std::vector<format::OpRecord>& trail, format::Origin origin) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::log", "inf", {stats(0, 0.5)});
  in.birth->op.index = 10;
  in.trail = trail;
  in.trail.push_back(in.birth->op);
  in.repeats = in.reproduced = 3;
  in.precision = format::Precision::fp32;
  in.origin = origin;
  return in;
}

}  // namespace

TEST(VerdictRules, OnlyALogOfASoftmaxIsToldToUseLogSoftmax) {
  // log(std) of a blank image: std is exactly 0, log(0) = -inf. Not a softmax.
  std::string advice =
      replay::decide(log_of({trail_op(9, "aten::std", stats(0, 0.5))}, format::Origin::cpp)).suggestion;
  EXPECT_EQ(advice.find("log_softmax"), std::string::npos) << advice;
  EXPECT_NE(advice.find("(the output of aten::std) reached 0"), std::string::npos) << advice;
  EXPECT_NE(advice.find("x.clamp_min(1e-7).log()"), std::string::npos) << advice;
  // No trail to read: clamp, and no guess at a softmax either.
  advice = replay::decide(log_of({}, format::Origin::cpp)).suggestion;
  EXPECT_EQ(advice.find("log_softmax"), std::string::npos) << advice;

  // log(softmax(x)), with autocast's cast between them: the fused form, in the user's language.
  format::TensorStats probs = stats(0, 0.5);
  probs.dtype = "BFloat16";
  const std::vector<format::OpRecord> softmax_then_cast{trail_op(7, "aten::_softmax", probs),
                                                        trail_op(8, "aten::softmax", probs),
                                                        trail_op(9, "aten::_to_copy", stats(0, 0.5))};
  advice = replay::decide(log_of(softmax_then_cast, format::Origin::cpp)).suggestion;
  EXPECT_NE(advice.find("use torch::log_softmax (or torch::nn::functional::cross_entropy on the logits)"),
            std::string::npos)
      << advice;
  advice = replay::decide(log_of(softmax_then_cast, format::Origin::python)).suggestion;
  EXPECT_NE(advice.find("use torch.log_softmax (or F.cross_entropy on the logits)"), std::string::npos) << advice;
  // An op between them that changed the values: the softmax is not the log's input.
  advice =
      replay::decide(log_of({trail_op(8, "aten::softmax", stats(0.1, 0.9)), trail_op(9, "aten::mul", stats(0, 0.5))},
                            format::Origin::cpp))
          .suggestion;
  EXPECT_EQ(advice.find("log_softmax"), std::string::npos) << advice;
}

TEST(VerdictRules, OptionsAndCodeAreNamedAsTheUserSetsThem) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::mul", "inf");
  in.birth->op.module = "blocks.0.mlp";
  in.repeats = in.reproduced = 3;
  in.fp32_finite = true;
  in.precision = format::Precision::fp16;
  in.fp32_search = replay::Fp32Search::found;
  in.fp32_modules = {"blocks.0.mlp", "head"};
  const std::pair<format::Origin, std::vector<std::string>> expected[] = {
      {format::Origin::nanscope_train,
       {"train with --fp32-modules blocks.0.mlp,head", "(or --fallback auto,", "train with --amp bf16"}},
      {format::Origin::unknown, {"train with --fp32-modules blocks.0.mlp,head", "train with --amp bf16"}},
      {format::Origin::cpp,
       {"set GuardOptions::fp32_modules = {\"blocks.0.mlp\", \"head\"}",
        "(or GuardOptions::fallback = nanscope::FallbackMode::automatic,",
        "set GuardOptions::amp = nanscope::Amp::bf16"}},
      {format::Origin::python,
       {"use nanscope.GuardConfig(fp32_modules=[\"blocks.0.mlp\", \"head\"])",
        "(or nanscope.GuardConfig(fallback=\"auto\"),", "use nanscope.StepGuard(..., amp=\"bf16\")"}},
  };
  for (const auto& [origin, fragments] : expected) {
    in.origin = origin;
    const std::string advice = replay::decide(in).suggestion;
    for (const std::string& fragment : fragments)
      EXPECT_NE(advice.find(fragment), std::string::npos) << format::to_string(origin) << ": " << advice;
    if (origin == format::Origin::cpp || origin == format::Origin::python) {
      EXPECT_EQ(advice.find("--"), std::string::npos) << "a flag for a loop with no command line: " << advice;
    }
  }

  // The check at the data boundary, for a corrupt sample.
  replay::VerdictInputs data;
  data.birth = birth_at("input", "nan");
  data.birth->op.phase = format::Phase::input;
  data.birth->sample = 1;
  data.batch_rows = {40, 41, 42};
  data.origin = format::Origin::cpp;
  std::string advice = replay::decide(data).suggestion;
  EXPECT_NE(advice.find("drop batch row 1 (data set row 41)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("TORCH_CHECK(torch::isfinite(x).all().item<bool>()"), std::string::npos) << advice;
  data.origin = format::Origin::python;
  data.batch_rows = {40, -1, 42};
  advice = replay::decide(data).suggestion;
  EXPECT_NE(advice.find("assert torch.isfinite(x).all()"), std::string::npos) << advice;
  EXPECT_NE(advice.find("drop batch row 1 (data set row unknown)"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("row -1"), std::string::npos) << advice;
}

TEST(VerdictRules, TheBirthsRowsNameTheSamplesOnlyWhenNotEveryRowWent) {
  replay::VerdictInputs in = log_of({}, format::Origin::nanscope_train);
  in.batch_rows = {10, 11, 12, -1};
  in.birth->rows = {1, 3};
  std::string advice = replay::decide(in).suggestion;
  EXPECT_NE(advice.find("aten::log made only batch rows 1 (data set row 11), 3 (data set row unknown) of 4 "
                        "non-finite: inspect them"),
            std::string::npos)
      << advice;
  in.birth->rows = {0, 1, 2, 3};  // every row: no one sample's doing
  advice = replay::decide(in).suggestion;
  EXPECT_EQ(advice.find("made only"), std::string::npos) << advice;
  in.birth->rows = {1};
  in.samples = {2};  // bisection found the sample: its finding is the one given
  advice = replay::decide(in).suggestion;
  EXPECT_NE(advice.find("Without batch row 2 (data set row 12) the step is finite, but it is an ordinary sample"),
            std::string::npos)
      << advice;
  EXPECT_EQ(advice.find("made only"), std::string::npos) << advice;
}

TEST(VerdictRules, TheEpsOfADivisionGoesWhereTheDivisorWasMade) {
  replay::VerdictInputs in;
  in.birth = birth_at("aten::div", "inf", {stats(-1, 1), stats(0, 2)});
  in.birth->op.index = 5;
  in.repeats = in.reproduced = 3;
  in.precision = format::Precision::fp32;
  in.trail = {trail_op(4, "aten::sqrt", stats(0, 2)), in.birth->op};
  std::string advice = replay::decide(in).suggestion;
  EXPECT_EQ(replay::decide(in).category, format::Category::div_by_zero);
  EXPECT_NE(advice.find("comes from aten::sqrt"), std::string::npos) << advice;
  EXPECT_NE(advice.find("put the eps inside it, (var + 1e-5).sqrt()"), std::string::npos) << advice;
  in.trail = {trail_op(4, "aten::sub", stats(0, 2)), in.birth->op};
  advice = replay::decide(in).suggestion;
  EXPECT_NE(advice.find("add eps to the divisor of aten::div in attn (a / (b + 1e-8))"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("sqrt"), std::string::npos) << advice;
}

// A replay whose re-runs all stayed finite proves nothing about the batch or
// the model, whatever the run's capture named: 0 of N is transient, the
// batch's own NaN included (an input the step never read).
TEST(VerdictRules, ReRunsThatStayedFiniteAreTransientWhateverTheBirth) {
  replay::VerdictInputs in;
  in.birth = birth_at("input", "nan", {});
  in.birth->op.phase = format::Phase::input;
  in.birth->sample = 1;
  in.repeats = 3;
  in.reproduced = 0;
  in.batch_rows = {-1, -1, -1, -1};
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::transient);
  in.reproduced = 3;
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::data);
}

// The same evidence gives the guard's remedy and the replay's verdict: an
// ordinary sample that drives an unsafe op is model_or_data on both sides,
// a sample far out of the batch's range is data on both.
TEST(VerdictRules, ARowOutOfTheBatchsRangeIsDataAnOrdinaryOneATrigger) {
  replay::VerdictInputs in = log_of({}, format::Origin::python);
  in.repeats = in.reproduced = 1;
  in.batch_rows = {-1, -1, -1, -1};
  in.rows_searched = true;
  in.samples = {2};
  replay::Verdict v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::model_or_data);
  EXPECT_NE(v.suggestion.find("it is an ordinary sample"), std::string::npos) << v.suggestion;
  EXPECT_EQ(cause_of(replay::cause_evidence(in)).rule, CauseRule::trigger_rows);
  in.rows_out_of_range = {2};
  v = replay::decide(in);
  EXPECT_EQ(v.verdict, format::Verdict::data);
  EXPECT_NE(v.suggestion.find("whose values lie over 1000x outside the rest of the batch's"), std::string::npos)
      << v.suggestion;
  in.samples.clear();
  in.rows_out_of_range.clear();
  in.rows_searched = false;
  in.rows_not_searched = "the row search cannot run on a batch of one row";
  EXPECT_EQ(cause_of(replay::cause_evidence(in)).rule, CauseRule::rows_not_searched);
  EXPECT_EQ(replay::decide(in).verdict, format::Verdict::model_or_data);
}

namespace {

// A frozen feature network whose input is what the optimizer steps, as in
// neural style transfer (Adam({image})).
struct Features : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(6, 4))};
  Features() {
    for (auto& p : parameters()) p.set_requires_grad(false);
  }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x); }
};

// The content loss and a hand-written total variation, sqrt(d^2): its
// gradient is 0/0 wherever two neighbouring pixels are equal.
at::Tensor style_loss(Features& net, const at::Tensor& image, const at::Tensor& target) {
  const at::Tensor d = image.slice(1, 1) - image.slice(1, 0, -1);
  return torch::mse_loss(net.forward(image), target) + 1e-3 * (d * d).sqrt().sum();
}

}  // namespace

// Every tensor the optimizer steps is the guard's, the model's or not: the
// image a style transfer optimizes has its gradient cleared between steps
// (a clean guarded run is bit for bit the plain loop), is in the snapshot,
// and the replay loads it into the replaying program's image (given its
// optimizer) or refuses, naming it; with it, the step's fault is reproduced,
// not called transient.
TEST(Replay, ATensorTheOptimizerStepsOutsideTheModelIsTheGuardsAndTheReplays) {
  test::TempDir dir;
  auto run = [&](bool guarded, int64_t steps, std::string* snapshot) {
    torch::manual_seed(0);
    Features net;
    at::Tensor image = torch::rand({2, 6}).requires_grad_(), target = torch::randn({2, 4});
    torch::optim::Adam optimizer({image}, torch::optim::AdamOptions(0.05));
    std::ostringstream log;
    GuardOptions o{dir.file("run"), Amp::fp32};
    o.log = &log;
    std::optional<StepGuard> guard;
    if (guarded) guard.emplace(net, optimizer, o);
    float kept = 0;
    for (int64_t step = 0; step < steps; ++step) {
      {
        torch::NoGradGuard no_grad;
        if (step == 3) {
          kept = image[1][3].item<float>();
          image[1][3] = image[1][2].item<float>();  // two equal neighbours: sqrt's gradient at 0
        }
        if (step == 4) image[1][3] = kept;  // the loop puts its pixel back (as a clamp would move it)
      }
      if (guarded) {
        const GuardedStep r = guard->closure_step([&] { return style_loss(net, image, target); }, {image, target});
        EXPECT_EQ(r.counted(), step != 3) << log.str();
        if (step == 3 && snapshot) *snapshot = r.snapshot;
      } else {
        optimizer.zero_grad();
        style_loss(net, image, target).backward();
        if (step != 3) optimizer.step();  // the plain loop, that update dropped
      }
    }
    return image.detach().clone();
  };
  std::string snapshot;
  const at::Tensor guarded = run(true, 6, &snapshot), plain = run(false, 6, nullptr);
  EXPECT_TRUE(at::equal(guarded, plain)) << guarded << plain;
  ASSERT_FALSE(snapshot.empty());
  const probe::SnapshotContents s = probe::read_snapshot(snapshot);
  const auto held =
      std::find_if(s.parameters.begin(), s.parameters.end(), [](const auto& p) { return p.first == "optimizer.0.0"; });
  ASSERT_NE(held, s.parameters.end()) << "the image at the step is in the snapshot";

  // The replaying program's own image differs (no equal neighbours: finite);
  // the snapshot's is loaded into it.
  Features net;
  at::Tensor image = torch::rand({2, 6}).requires_grad_();
  torch::optim::Adam optimizer({image}, torch::optim::AdamOptions(0.05));
  BatchLoss loss = [&](const Batch& b) { return style_loss(net, image, b.targets); };
  const char* argv[] = {"program", snapshot.c_str(), "--no-write"};
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(replay::replay_main(3, argv, net, loss), kExitBadInput);
  const std::string refused = testing::internal::GetCapturedStderr() + testing::internal::GetCapturedStdout();
  EXPECT_NE(refused.find("'optimizer.0.0' outside the model"), std::string::npos) << refused;
  testing::internal::CaptureStdout();
  EXPECT_EQ(replay::replay_main(3, argv, net, loss, {}, &optimizer), kExitOk);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("verdict:    model_or_data"), std::string::npos) << out;
  EXPECT_NE(out.find("sqrt_grad_zero"), std::string::npos) << out;
  EXPECT_TRUE(at::equal(image.detach(), held->second)) << "the replay ran the snapshot's image";
}

// The rewrite a user would write for a hand-written binary cross-entropy:
// log(1 - sigmoid(z)) is logsigmoid(-z). The trail shows log's input made by
// 1 - x from a sigmoid's output; the rsub's own inner sub and an unrelated
// 1 - y over targets in [0, 1] (values that map onto themselves) are passed over.
TEST(VerdictRules, TheLogOfOneMinusASigmoidIsToldToUseLogsigmoidOfMinusZ) {
  replay::VerdictInputs in =
      log_of({trail_op(3, "aten::sigmoid", stats(4e-18, 1)), trail_op(5, "aten::rsub", stats(0, 1)),  // 1 - y
              trail_op(8, "aten::sub", stats(0, 1)), trail_op(9, "aten::rsub", stats(0, 1))},
             format::Origin::python);
  in.birth->inputs = {stats(0, 1)};
  std::string advice = replay::decide(in).suggestion;
  EXPECT_NE(advice.find("it is logsigmoid(-z), so use F.logsigmoid(-z)"), std::string::npos) << advice;
  // The same 1 - x over something else is no sigmoid's: clamped, as any log's input.
  in.trail[0].op = "aten::tanh";
  advice = replay::decide(in).suggestion;
  EXPECT_EQ(advice.find("logsigmoid"), std::string::npos) << advice;
  EXPECT_NE(advice.find("clamp"), std::string::npos) << advice;
}
