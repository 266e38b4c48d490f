// Every scenario of samples/faults/: the first birth is found at the right op,
// phase, module and step, and the snapshot written for that step holds it.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/test_support.hpp"

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/snapshot.hpp"

using namespace nanscope;

namespace {

// The step of a scenario decided by its data or planted fault; kFirstSkip for
// one decided by growth (an LR explosion overflows when rounding says so, a
// step sooner or later on another CPU): then the run's own first skip is the
// step the snapshot and the birth must be at.
constexpr int64_t kFirstSkip = -1;

struct Scenario {
  const char* file;
  int64_t step;
  const char* kind;
  const char* op;
  const char* phase;
  const char* module;
  const char* backward_node;
  const char* forward_op;
  int64_t sample;
  bool needs_fp16;
  int exit_code = kExitOk;  // a cause that persists kills the run (exit 4)
};

std::ostream& operator<<(std::ostream& os, const Scenario& s) { return os << s.file; }

const Scenario kCatalog[] = {
    {"p08-log-nonpositive", 6, "nan", "aten::log", "forward", "blocks.0.mlp", "", "", -1, false},
    {"p08-sqrt-grad-zero", 6, "inf", "aten::div", "backward", "blocks.0.attn", "SqrtBackward0", "aten::sqrt", -1,
     false},
    {"p08-div-zero-variance", 6, "nan", "aten::div", "forward", "blocks.0.ln1", "", "", -1, false},
    {"p08-exp-overflow", 6, "inf", "aten::exp", "forward", "", "", "", -1, false},
    {"p10-bf16-cancellation", 6, "inf", "aten::div", "forward", "blocks.0.ln1", "", "", -1, false},
    {"p10-fp16-overflow", 6, "inf", "aten::mul", "forward", "blocks.0.mlp", "", "", -1, true},
    {"p11-corrupt-sample", 6, "nan", "input", "input", "", "", "", 3, false},
    // The LR stays x10000: every step after the first overflows, even after
    // the fallback's halving, and with no good state saved yet the run is dead.
    {"p12-lr-explosion", kFirstSkip, "inf", "aten::addmm", "forward", "head", "", "", -1, false, kExitDeadRun},
    {"p15-logit-drift", 6, "inf", nullptr, "forward", "head", "", "", -1, true},
    {"p16-attention-logit-growth", 6, "inf", nullptr, "forward", "blocks.0.attn", "", "", -1, true},
    {"masked-attention-row", 6, "nan", "aten::softmax", "forward", "blocks.0.attn", "", "", -1, false},
};

class Catalog : public ::testing::TestWithParam<Scenario> {};

TEST_P(Catalog, FirstBirthIsFoundAtTheRightOpPhaseModuleAndStep) {
  const Scenario& s = GetParam();
  if (s.needs_fp16 && !compat::autocast_supported(c10::kCPU, at::kHalf))
    GTEST_SKIP() << "needs fp16 autocast (CUDA, or CPU with LibTorch 2.x)";
  test::TempDir dir;
  const std::string config = std::string(test::paths::samples) + "/faults/" + s.file + ".toml";
  auto r = test::run_command(std::string(test::paths::train_exe) + " --config " + config +
                             " --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, s.exit_code) << r.output;

  // The run skipped exactly the planted step first and recorded the snapshot.
  auto run = format::read_run(dir.file("run/run.h5"));
  int64_t first_skip = -1;
  for (size_t i = 0; i < run.rows() && first_skip < 0; ++i)
    if (run.skipped[i]) first_skip = run.step[i];
  ASSERT_GE(first_skip, 0) << "no step went non-finite";
  const int64_t step = s.step == kFirstSkip ? first_skip : s.step;
  EXPECT_EQ(first_skip, step);
  bool snapshot_event = false;
  for (const auto& e : run.events) snapshot_event |= e.kind == format::EventKind::snapshot && e.step == step;
  EXPECT_TRUE(snapshot_event);

  const std::string path = probe::snapshot_path(dir.file("run"), step);
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  probe::SnapshotContents snap = probe::read_snapshot(path);
  EXPECT_EQ(snap.step, step);
  ASSERT_TRUE(snap.capture.reproduced);
  ASSERT_TRUE(snap.capture.first_birth.has_value());
  const format::Birth& b = *snap.capture.first_birth;
  EXPECT_EQ(std::string(format::to_string(b.kind)), s.kind);
  if (s.op) {
    EXPECT_EQ(b.op.op, s.op);
  }
  EXPECT_EQ(std::string(format::to_string(b.op.phase)), s.phase);
  EXPECT_EQ(b.op.module, s.module);
  EXPECT_EQ(b.op.backward_node, s.backward_node);
  EXPECT_EQ(b.op.forward_op, s.forward_op);
  EXPECT_EQ(b.sample, s.sample);
  // The trail ends at the birth.
  if (b.op.phase != format::Phase::input) {
    ASSERT_FALSE(snap.capture.trail.empty());
    EXPECT_EQ(snap.capture.trail.back().op, b.op.op);
  }
}

INSTANTIATE_TEST_SUITE_P(SamplesFaults, Catalog, ::testing::ValuesIn(kCatalog), [](const auto& info) {
  std::string name = info.param.file;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
});

}  // namespace

TEST(Catalog, Bf16OnlyFailureRunsCleanInFp32) {
  test::TempDir dir;
  const std::string config = std::string(test::paths::samples) + "/faults/p10-bf16-cancellation.toml";
  auto r = test::run_command(std::string(test::paths::train_exe) + " --config " + config +
                             " --amp off --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = format::read_run(dir.file("run/run.h5"));
  for (size_t i = 0; i < run.rows(); ++i) EXPECT_EQ(run.skipped[i], 0) << "step " << i;
}

TEST(Catalog, LrExplosionShowsTheGradNormRiseBeforeTheFirstSkip) {
  test::TempDir dir;
  const std::string config = std::string(test::paths::samples) + "/faults/p12-lr-explosion.toml";
  auto r = test::run_command(std::string(test::paths::train_exe) + " --config " + config +
                             " --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, kExitDeadRun) << r.output;  // the LR stays up: see kCatalog
  auto run = format::read_run(dir.file("run/run.h5"));
  // The LR goes x10000 at step 10; when the forward overflows depends on
  // rounding, so the rise is read up to the run's own first skip.
  size_t first_skip = 0;
  while (first_skip < run.rows() && !run.skipped[first_skip]) ++first_skip;
  ASSERT_LT(first_skip, run.rows()) << "the explosion never overflowed";
  ASSERT_GE(first_skip, 12u) << "a rise needs finite steps after the spike";
  EXPECT_GT(run.grad_norm[first_skip - 2], 100 * run.grad_norm[9]);
  EXPECT_GT(run.grad_norm[first_skip - 1], 10 * run.grad_norm[first_skip - 2]);
}

// The slow-onset scenarios: a warning comes at least 10 steps before the
// first non-finite step.
TEST(Catalog, SlowOnsetScenariosWarnTenStepsOrMoreAhead) {
  for (const char* name : {"slow-lr-ramp", "slow-input-ramp"}) {
    test::TempDir dir;
    const std::string config = std::string(test::paths::samples) + "/faults/" + name + ".toml";
    auto r = test::run_command(std::string(test::paths::train_exe) + " --config " + config +
                               " --quiet --threads 1 --run-dir " + dir.file("run"));
    // The ramp goes on after the first non-finite step, so the run either
    // ends or, once 20 steps in a row fail with no rollback left, stops dead:
    // where that falls against the last step depends on how the growth rounds.
    ASSERT_TRUE(r.exit_code == kExitOk || r.exit_code == kExitDeadRun) << name << ":\n" << r.output;
    const format::RunData run = format::read_run(dir.file("run/run.h5"));
    int64_t first_skip = -1, first_warning = -1;
    for (size_t i = 0; i < run.rows() && first_skip < 0; ++i)
      if (run.skipped[i]) first_skip = run.step[i];
    for (const auto& e : run.events)
      if (e.kind == format::EventKind::warning && first_warning < 0) first_warning = e.step;
    ASSERT_GE(first_skip, 0) << name << ": the fault never went non-finite";
    ASSERT_GE(first_warning, 0) << name << ": no warning";
    EXPECT_GE(first_skip - first_warning, 10) << name;
  }
}

// The burst scenario with the fixture model it names: rolled back once, to
// the state saved just before the burst.
TEST(Catalog, SampleBurstIsRolledBackToTheStateBeforeIt) {
  test::TempDir dir;
  auto fixture = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                   "/make_scripted_model.py " + dir.path().string());
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  auto r = test::run_command(std::string(test::paths::train_exe) + " --config " + test::paths::samples +
                             "/faults/sample-burst.toml --model " + dir.file("relu_regressor.pt") + " --data " +
                             dir.file("regressor_data.h5") + " --quiet --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1 rollback(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rollback to step 99:"), std::string::npos) << r.output;
}
