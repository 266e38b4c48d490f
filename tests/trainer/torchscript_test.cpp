// A TorchScript model written by Debian's python3-torch trains in C++.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "../support/test_support.hpp"

#include "nanscope/core/checkpoint.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/snapshot.hpp"
#include "nanscope/probe/tensor_io.hpp"
#include "nanscope/trainer/trainer.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

class TorchScript : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                               "/make_scripted_model.py " + dir_->path().string());
    ASSERT_EQ(r.exit_code, 0) << "the fixture needs python3-torch and python3-h5py:\n" << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static TrainOptions options(const std::string& run) {
    TrainOptions o;
    o.model = dir_->file("regressor.pt");
    o.data = dir_->file("regressor_data.h5");
    o.steps = 60;
    o.batch_size = 32;
    o.lr = 1e-2;
    o.run_dir = dir_->file(run);
    o.quiet = true;
    o.threads = 1;
    return o;
  }
  static test::TempDir* dir_;
};
test::TempDir* TorchScript::dir_ = nullptr;

TEST_F(TorchScript, TrainsToAFallingLoss) {
  TrainSummary summary = run(options("plain"), std::cerr);
  auto r = format::read_run(summary.run_file);
  ASSERT_EQ(r.rows(), 60u);
  const double first = std::accumulate(r.loss.begin(), r.loss.begin() + 5, 0.0) / 5;
  const double last = std::accumulate(r.loss.end() - 5, r.loss.end(), 0.0) / 5;
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  EXPECT_EQ(r.layer_names, (std::vector<std::string>{"encoder.0", "head"}));
}

TEST_F(TorchScript, NonFiniteSampleIsSkippedAndTheRunGoesOn) {
  TrainOptions o = options("poisoned");
  o.amp = Amp::bf16;
  o.faults = {parse_fault("nonfinite_input@10:7")};
  TrainSummary summary = run(o, std::cerr);
  EXPECT_EQ(summary.skipped, 1);
  EXPECT_EQ(summary.fallback_step, 10);
  auto r = format::read_run(summary.run_file);
  EXPECT_FALSE(std::isfinite(r.loss[10]));
  EXPECT_TRUE(std::isfinite(r.loss[59]));
}

// llama2.c's attention on torch 1.x: an additive causal mask registered as a
// buffer, -inf above the diagonal. The model's own infinities are no sick
// state: the run trains, a planted NaN sample is still found and skipped,
// rollback states and checkpoints are kept, and --resume takes them.
TEST_F(TorchScript, AnAdditiveMinusInfMaskBufferIsTheModelsOwnNotASickState) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const std::string args = " --model " + dir_->file("masked_attention_regressor.pt") + " --data " +
                           dir_->file("regressor_data.h5") +
                           " --batch-size 16 --amp bf16 --quiet --threads 1 --checkpoint-every 10 --rollback-every 5";
  auto r = test::run_command(std::string(test::paths::train_exe) + args + " --steps 30 --fault nonfinite_input@12:3" +
                             " --run-dir " + run_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 12: first birth: nan at input (input) in module '', batch row 3"), std::string::npos)
      << r.output;
  auto run_file = format::read_run(run_dir + "/run.h5");
  ASSERT_EQ(run_file.rows(), 30u);
  for (size_t i = 0; i < run_file.rows(); ++i)
    EXPECT_EQ(bool(run_file.skipped[i]), run_file.step[i] == 12) << "step " << run_file.step[i];
  for (const auto& e : run_file.events) {
    EXPECT_NE(e.kind, format::EventKind::stop) << e.text;
    EXPECT_NE(e.kind, format::EventKind::save_refused) << e.text;
    EXPECT_NE(e.kind, format::EventKind::rollback) << e.text;
  }
  auto health = checkpoint_health(run_dir + "/checkpoint.h5");
  ASSERT_TRUE(health.has_value());
  EXPECT_TRUE(health->finite);
  EXPECT_EQ(health->step, 30);

  auto resumed = test::run_command(std::string(test::paths::train_exe) + " --resume " + run_dir + " --steps 40");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(healthy)"), std::string::npos) << resumed.output;
  EXPECT_EQ(format::read_run(run_dir + "/run.h5").rows(), 40u);
}

TEST_F(TorchScript, ModelFaultsNeedABuiltInModel) {
  TrainOptions o = options("bad");
  o.faults = {parse_fault("log_nonpositive@1")};
  EXPECT_THROW(run(o, std::cerr), std::invalid_argument);
}

TEST_F(TorchScript, OpRaisingOnANanIsANonFiniteStepAndTheRunGoesOn) {
  // binary_cross_entropy raises on the NaN born at log in "enc": the step is
  // skipped like any non-finite step, its birth found and snapshotted.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  auto r = test::run_command(std::string(test::paths::train_exe) + " --model " + dir_->file("raises_after_nan.pt") +
                             " --data " + dir_->file("regressor_data.h5") +
                             " --steps 3 --batch-size 16 --quiet --threads 1 --run-dir " + run_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 0: first birth: nan at aten::log (forward) in module 'enc'"), std::string::npos)
      << r.output;
  auto run_file = format::read_run(run_dir + "/run.h5");
  ASSERT_EQ(run_file.rows(), 3u);
  std::string skip_text;
  for (const auto& e : run_file.events)
    if (e.kind == format::EventKind::skip && e.step == 0) skip_text = e.text;
  EXPECT_NE(skip_text.find("the model raised: "), std::string::npos) << skip_text;
  EXPECT_NE(skip_text.find("between 0 and 1"), std::string::npos) << skip_text;
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/snapshots/step-0000000.h5"));
}

// llama2.c's RMSNorm with its eps outside the sqrt, and an all-zero sample:
// the forward and loss are finite, sqrt's derivative divides by zero. The
// birth is named by the scripted module that ran the sqrt, and by its row
// (data set row 13 is the second batch's row 5 without shuffling).
TEST_F(TorchScript, ABackwardBirthInAScriptedModuleNamesItsModuleAndRow) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  auto r =
      test::run_command(std::string(test::paths::train_exe) + " --model " + dir_->file("rmsnorm_regressor.pt") +
                        " --data " + dir_->file("zero_row_data.h5") +
                        " --steps 3 --batch-size 8 --no-shuffle --amp fp32 --quiet --threads 1 --run-dir " + run_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" at aten::div (backward, in SqrtBackward0 of aten::sqrt) in module 'norm', batch row 5"),
            std::string::npos)
      << r.output;
  auto run_file = format::read_run(run_dir + "/run.h5");
  ASSERT_EQ(run_file.rows(), 3u);
  EXPECT_TRUE(run_file.skipped[1]);
  EXPECT_FALSE(run_file.skipped[0]);
}

TEST_F(TorchScript, ModelThatRaisesWithoutANanFailsTheRunInOneLine) {
  test::TempDir dir;
  auto r = test::run_command(std::string(test::paths::train_exe) + " --model " + dir_->file("raises_always.pt") +
                             " --data " + dir_->file("regressor_data.h5") +
                             " --steps 3 --batch-size 16 --quiet --threads 1 --run-dir " + dir.file("run"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const auto failed = r.output.find("nanscope-train: training failed: step 0: ");
  ASSERT_NE(failed, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find('\n', failed), r.output.size() - 1) << "one line, at the end:\n" << r.output;
  EXPECT_EQ(r.output.find("Traceback of TorchScript"), std::string::npos) << r.output;
}

TEST_F(TorchScript, AModelOutsideTheContractExitsTwoNamingIt) {
  // forward(x) instead of forward(inputs, targets), and per-sample losses
  // instead of a scalar: bad input in one line, before any step.
  for (const auto& [model, says] : {std::pair<std::string, std::string>{"one_argument.pt", "it is forward("},
                                    {"vector_loss.pt", "must return a scalar loss"}}) {
    test::TempDir dir;
    auto r = test::run_command(std::string(test::paths::train_exe) + " --model " + dir_->file(model) + " --data " +
                               dir_->file("regressor_data.h5") + " --steps 3 --quiet --run-dir " + dir.file("run"));
    EXPECT_EQ(r.exit_code, 2) << model << "\n" << r.output;
    EXPECT_NE(r.output.find(model), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 0"), std::string::npos) << "refused before training:\n" << r.output;
  }
}

TEST(TiedWeights, StepLikePyTorchWithTheSharedTensorOnce) {
  // An embedding tied to the output head: LibTorch lists the tensor under both
  // names. Stepped twice, counted twice in the norm and the clip, it drifts
  // from PyTorch within a few steps; stepped once, it follows it.
  test::TempDir dir;
  const int steps = 12, batch = 8;
  auto fixture =
      test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures + "/tied_lm_reference.py " +
                        dir.path().string() + " " + std::to_string(steps) + " " + std::to_string(batch) + " 0.01");
  ASSERT_EQ(fixture.exit_code, 0) << fixture.output;
  std::ifstream reference(dir.file("reference_losses.txt"));
  int64_t python_parameters = 0;
  reference >> python_parameters;
  std::vector<double> expected;
  for (double v; reference >> v;) expected.push_back(v);
  ASSERT_EQ(expected.size(), size_t(steps));

  TrainOptions o;
  o.model = dir.file("tied_lm.pt");
  o.data = dir.file("tokens.h5");
  o.steps = steps;
  o.batch_size = batch;
  o.lr = 0.01;
  o.shuffle = false;
  o.run_dir = dir.file("run");
  o.quiet = true;
  o.threads = 1;
  std::ostringstream log;
  TrainSummary summary = run(o, log);
  EXPECT_NE(log.str().find("(" + std::to_string(python_parameters) + " parameters)"), std::string::npos) << log.str();
  auto r = format::read_run(summary.run_file);
  ASSERT_EQ(r.rows(), size_t(steps));
  for (int i = 0; i < steps; ++i) EXPECT_NEAR(r.loss[i], expected[i], 1e-4 * expected[i]) << "step " << i;
  // The shared tensor counts under its first name: lm_head owns no parameter of its own.
  EXPECT_EQ(r.layer_names, (std::vector<std::string>{"wte", "ln", "mlp"}));
}

// --init with another model's checkpoint: exit 2, one line naming the file,
// the first parameter that does not fit and, for a shape, both shapes.
TEST_F(TorchScript, InitFromAnotherModelsCheckpointNamesTheFirstMismatch) {
  const std::string train = test::paths::train_exe;
  const std::string data = " --data " + dir_->file("regressor_data.h5") + " --quiet --threads 1 --steps 2";
  auto saved = test::run_command(train + " --model " + dir_->file("regressor.pt") + data + " --run-dir " +
                                 dir_->file("init-a") + " --save " + dir_->file("regressor-ckpt.h5"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  auto wider = test::run_command(train + " --model " + dir_->file("wide_regressor.pt") + data + " --run-dir " +
                                 dir_->file("init-b") + " --init " + dir_->file("regressor-ckpt.h5"));
  EXPECT_EQ(wider.exit_code, 2) << wider.output;
  EXPECT_NE(wider.output.find("regressor-ckpt.h5"), std::string::npos) << wider.output;
  EXPECT_NE(wider.output.find("parameter 'encoder.0.weight' has shape [32, 6], the model expects [64, 6]"),
            std::string::npos)
      << wider.output;
  auto other = test::run_command(train + " --model " + dir_->file("poisons_its_weights.pt") + data + " --run-dir " +
                                 dir_->file("init-c") + " --init " + dir_->file("regressor-ckpt.h5"));
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("parameter 'gain' missing"), std::string::npos) << other.output;
}

// Integer and bool buffers keep their type: casting the model to fp32 (at the
// start, and at the fallback after a skipped step) touches floating tensors
// only, as PyTorch's Module.to(dtype) does. An int64 index buffer cast to
// float broke the embedding at step 0; a float num_batches_tracked went into
// checkpoints and snapshots.
TEST_F(TorchScript, IntegerAndBoolBuffersKeepTheirTypeInTheModelCheckpointsAndSnapshots) {
  TrainOptions o = options("typed-buffers");
  o.model = dir_->file("typed_buffers.pt");
  o.steps = 12;
  o.amp = Amp::bf16;
  o.faults = {parse_fault("nonfinite_input@5:3")};  // a skip, a snapshot and the fp32 fallback
  o.save = dir_->file("typed-buffers.h5");
  TrainSummary summary = run(o, std::cerr);
  EXPECT_EQ(summary.skipped, 1);
  EXPECT_EQ(summary.fallback_step, 5);
  const std::map<std::string, format::DType> expected{{"position_ids", format::DType::int64},
                                                      {"feature_mask", format::DType::boolean},
                                                      {"norm.running_mean", format::DType::float32},
                                                      {"norm.num_batches_tracked", format::DType::int64}};
  format::Archive checkpoint = format::Archive::open(o.save, format::kCheckpointFileKind);
  for (const auto& [name, dtype] : expected)
    EXPECT_EQ(checkpoint.root().group("buffers").tensor(name).dtype, dtype) << name << " in the checkpoint";
  const probe::SnapshotContents snapshot =
      probe::read_snapshot((std::filesystem::path(o.run_dir) / "snapshots" / "step-0000005.h5").string());
  for (const auto& [name, dtype] : expected) {
    auto it =
        std::find_if(snapshot.buffers.begin(), snapshot.buffers.end(), [&](const auto& b) { return b.first == name; });
    ASSERT_NE(it, snapshot.buffers.end()) << name;
    EXPECT_EQ(probe::to_format_dtype(it->second.scalar_type()), dtype) << name << " in the snapshot";
  }
  // The saved values load into a new run of the same model.
  EXPECT_EQ(checkpoint.root().group("buffers").tensor("position_ids").shape, (std::vector<int64_t>{6}));
  TrainOptions again = options("typed-buffers-init");
  again.model = o.model;
  again.steps = 2;
  again.init = o.save;
  EXPECT_NO_THROW(run(again, std::cerr));
}
