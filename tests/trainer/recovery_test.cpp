// Recovery you can trust: a skipped step leaves the model as it was (its
// buffers included), a buffer that goes non-finite is caught, a sick state is
// never saved, and --resume takes the newest healthy checkpoint.
#include <gtest/gtest.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <memory>

#include "../support/test_support.hpp"

#include "nanscope/common/exit_codes.hpp"
#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/journal.hpp"
#include "nanscope/core/module_model.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/step_guard.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/models/scripted_model.hpp"

using namespace nanscope;

// make_scripted_model.py's models and data, written once for the suite.
class Recovery : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixtures_ = new test::TempDir();
    const auto made = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                        "/make_scripted_model.py " + fixtures_->path().string());
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  static void TearDownTestSuite() {
    delete fixtures_;
    fixtures_ = nullptr;
  }
  static std::string fixture(const std::string& name) { return fixtures_->file(name); }
  static std::string train(const std::string& run_dir, const std::string& flags) {
    return std::string(test::paths::train_exe) + " --model " + fixture("batchnorm_classifier.pt") + " --data " +
           fixture("classes_data.h5") + " --batch-size 32 --lr 0.01 --amp bf16 --quiet --threads 1 --run-dir " +
           run_dir + " " + flags;
  }
  // The run in `run_dir` resumed from its checkpoint, up to `steps` steps.
  static test::CommandResult resume(const std::string& run_dir, int steps) {
    return test::run_command(std::string(test::paths::train_exe) + " --resume " + run_dir + " --steps " +
                             std::to_string(steps));
  }
  // Edits an HDF5 file in place with h5py (`f` is the open file): a file as
  // another writer, or an older nanscope, left it.
  static void edit_with_h5py(const std::string& path, const std::string& statements) {
    const auto edited =
        test::run_command(std::string(test::paths::python) + " -c \"import h5py, numpy; f = h5py.File('" + path +
                          "', 'r+'); " + statements + "\"");
    ASSERT_EQ(edited.exit_code, 0) << edited.output;
  }
  static test::TempDir* fixtures_;
};
test::TempDir* Recovery::fixtures_ = nullptr;

namespace {

NamedTensors copy_of_state(const TrainableModel& model, const torch::optim::Optimizer& optimizer) {
  NamedTensors out;
  for (const auto& [name, t] : model.named_parameters()) out.emplace_back("parameter " + name, t.detach().clone());
  for (const auto& [name, t] : model.named_buffers()) out.emplace_back("buffer " + name, t.clone());
  for (const auto& [name, t] : optimizer_state_by_name(optimizer, model.trainable_parameters()))
    out.emplace_back("optimizer " + name, t.clone());
  return out;
}

// Bit for bit, tensor by tensor, naming the first that differs.
void expect_same_state(const NamedTensors& before, const NamedTensors& after) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].first, after[i].first);
    EXPECT_TRUE(at::equal(before[i].second, after[i].second)) << before[i].first << " changed";
  }
}

at::Tensor buffer(const TrainableModel& model, const std::string& name) {
  for (const auto& [n, t] : model.named_buffers())
    if (n == name) return t;
  ADD_FAILURE() << "no buffer " << name;
  return {};
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A NaN sample at step 3 of a bf16 run: the step is skipped, and the model,
// its BatchNorm statistics and counter included, is exactly as before it.
void expect_nan_sample_skip_is_a_transaction(TrainableModel& model, const std::string& run_dir, const std::string& bn) {
  model.set_training(true);
  torch::optim::AdamW optimizer(trainable_tensors(model), torch::optim::AdamWOptions(1e-2));
  GuardOptions options{run_dir, Amp::bf16};
  options.fallback = FallbackMode::off;  // the state under test is the skip's alone
  StepGuard guard(model, optimizer, options);
  at::manual_seed(0);
  const at::Tensor x = at::randn({32, 6}), y = at::randint(0, 4, {32});
  for (int64_t s = 0; s < 3; ++s) ASSERT_FALSE(guard.closure_step(x, y, StepContext::numbered(s)).outcome.skipped);
  const NamedTensors before = copy_of_state(model, optimizer);

  at::Tensor poisoned = x.clone();
  poisoned[5].fill_(std::nan(""));
  const GuardedStep skipped = guard.closure_step(poisoned, y, StepContext::numbered(3));
  ASSERT_TRUE(skipped.outcome.skipped);
  EXPECT_TRUE(contains(skipped.restored, bn + ".running_mean"));
  EXPECT_TRUE(contains(skipped.restored, bn + ".running_var"));
  EXPECT_TRUE(contains(skipped.restored, bn + ".num_batches_tracked"));
  expect_same_state(before, copy_of_state(model, optimizer));
  EXPECT_EQ(buffer(model, bn + ".num_batches_tracked").item<int64_t>(), 3) << "the forensic re-run counted too";
  EXPECT_TRUE(guard.health().finite()) << guard.health().text();

  // The model a user would evaluate now answers with numbers.
  model.set_training(false);
  EXPECT_TRUE(std::isfinite(model.loss(x, y).item<double>()));
}

}  // namespace

TEST_F(Recovery, ASkippedStepPutsBackTheBuffersATorchScriptForwardWrote) {
  test::TempDir dir;
  auto model = load_scripted_model(fixture("batchnorm_classifier.pt"));
  expect_nan_sample_skip_is_a_transaction(*model, dir.file("run"), "bn");
}

TEST_F(Recovery, ASkippedStepPutsBackTheBuffersANativeForwardWrote) {
  test::TempDir dir;
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16), torch::nn::ReLU(),
                            torch::nn::Linear(16, 4));
  ModuleModel model("bn_net", net.ptr(), [net](const at::Tensor& x, const at::Tensor& y) mutable {
    return torch::nn::functional::cross_entropy(net->forward(x).to(at::kFloat), y);
  });
  expect_nan_sample_skip_is_a_transaction(model, dir.file("run"), "1");
}

TEST_F(Recovery, AFiniteStepThatLeavesABufferNonFiniteDoesNotCount) {
  // A finite but huge batch: the loss and the gradients are finite (BatchNorm
  // normalises it away), but its variance overflows fp32 into running_var.
  test::TempDir dir;
  auto model = load_scripted_model(fixture("batchnorm_classifier.pt"));
  model->set_training(true);
  torch::optim::AdamW optimizer(trainable_tensors(*model), torch::optim::AdamWOptions(1e-2));
  GuardOptions options{dir.file("run"), Amp::bf16};
  options.fallback = FallbackMode::off;
  StepGuard guard(*model, optimizer, options);
  at::manual_seed(0);
  const at::Tensor x = at::randn({32, 6}), y = at::randint(0, 4, {32});
  for (int64_t s = 0; s < 3; ++s) ASSERT_FALSE(guard.closure_step(x, y, StepContext::numbered(s)).outcome.skipped);
  const NamedTensors before = copy_of_state(*model, optimizer);

  const GuardedStep huge = guard.closure_step(x * 1e30, y, StepContext::numbered(3));
  EXPECT_FALSE(huge.outcome.buffers_finite);
  EXPECT_TRUE(huge.outcome.skipped);
  expect_same_state(before, copy_of_state(*model, optimizer));
  guard.flush();
  const auto skips = test::event_lines(format::read_run(guard.run_file()), format::EventKind::skip);
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_NE(skips[0].find("non-finite buffers"), std::string::npos) << skips[0];
  EXPECT_NE(skips[0].find("bn.running_var"), std::string::npos) << skips[0];
}

TEST_F(Recovery, TheCheckpointOfARunWithASkippedNanSampleHoldsHealthyStatistics) {
  test::TempDir dir;
  const auto r = test::run_command(
      train(dir.file("run"), "--steps 40 --fault nonfinite_input@10:3 --save " + dir.file("model.h5")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto model = load_scripted_model(fixture("batchnorm_classifier.pt"));
  EXPECT_EQ(load_checkpoint(dir.file("model.h5"), *model), 40);
  EXPECT_TRUE(state_health(*model, nullptr).finite()) << state_health(*model, nullptr).text();
  EXPECT_EQ(buffer(*model, "bn.num_batches_tracked").item<int64_t>(), 39)
      << "one BatchNorm update per counted step: neither the skipped forward nor its re-run";
  const auto skips = test::event_lines(format::read_run(dir.file("run/run.h5")), format::EventKind::skip);
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_NE(skips[0].find("buffers restored: bn.running_mean, bn.running_var, bn.num_batches_tracked"),
            std::string::npos)
      << skips[0];
}

TEST_F(Recovery, ASickStateIsNeverCheckpointedAndResumeStartsFromTheHealthyOne) {
  // NaN lands in bn.running_mean between step 5 and the checkpoint after it
  // (a write outside any step): that checkpoint is refused, the next step
  // finds the state sick, and with no rollback the run is dead.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const auto r =
      test::run_command(train(run_dir, "--steps 12 --checkpoint-every 3 --rollback off --fault buffer_nan@5"));
  ASSERT_EQ(r.exit_code, kExitDeadRun) << r.output;
  const format::RunData run = format::read_run(run_dir + "/run.h5");
  const auto refused = test::event_lines(run, format::EventKind::save_refused);
  ASSERT_EQ(refused.size(), 1u) << r.output;
  EXPECT_EQ(refused[0].rfind("5: checkpoint after step 5 not written: buffer bn.running_mean", 0), 0u) << refused[0];
  const auto stops = test::event_lines(run, format::EventKind::stop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_NE(stops[0].find("buffer bn.running_mean"), std::string::npos) << stops[0];
  EXPECT_EQ(checkpoint_step(run_dir + "/checkpoint.h5"), 3) << "the last healthy checkpoint stays";
  const std::optional<CheckpointHealth> health = checkpoint_health(run_dir + "/checkpoint.h5");
  ASSERT_TRUE(health);
  EXPECT_TRUE(health->finite);
  EXPECT_TRUE(std::isfinite(health->loss));

  // Killed there, and resumed.
  const auto resumed = resume(run_dir, 6);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoint.h5, from step 3 (healthy)"), std::string::npos) << resumed.output;
}

TEST_F(Recovery, ResumePassesOverASickCheckpointForTheOneBeforeIt) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const auto r = test::run_command(train(run_dir, "--steps 9 --checkpoint-every 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // A checkpoint from a writer that saved NaN statistics and recorded no
  // health: nanscope before format 1.1 (or another tool writing its schema).
  edit_with_h5py(run_dir + "/checkpoint.h5",
                 "f['buffers/bn.running_var'][...] = numpy.nan; f.attrs['format_version'] = '1.0'; "
                 "del f.attrs['finite']; del f.attrs['loss']; del f['training'].attrs['applied_steps']");
  const auto resumed = resume(run_dir, 12);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoint.h5 (step 9): non-finite buffer bn.running_var"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoint.previous.h5, from step 6 (healthy)"), std::string::npos) << resumed.output;
}

TEST_F(Recovery, WithRollbackASickStateIsUndoneAndTheRunGoesOn) {
  test::TempDir dir;
  const auto r = test::run_command(
      train(dir.file("run"), "--steps 24 --rollback-every 2 --fault buffer_nan@9 --save " + dir.file("model.h5")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const format::RunData run = format::read_run(dir.file("run/run.h5"));
  EXPECT_EQ(test::event_lines(run, format::EventKind::rollback).size(), 1u) << r.output;
  auto model = load_scripted_model(fixture("batchnorm_classifier.pt"));
  load_checkpoint(dir.file("model.h5"), *model);
  EXPECT_TRUE(state_health(*model, nullptr).finite());
  EXPECT_NE(r.output.find("saved: " + dir.file("model.h5") + " (the model after step 23)"), std::string::npos)
      << r.output;
}

TEST_F(Recovery, AFormatOnePointZeroCheckpointStillResumes) {
  // The same run's checkpoint as nanscope wrote it before format 1.1: no
  // health, no count of applied updates. Read by version, not by guessing.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const auto r = test::run_command(train(run_dir, "--steps 6 --checkpoint-every 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string checkpoint = run_dir + "/checkpoint.h5";
  ASSERT_TRUE(checkpoint_health(checkpoint));
  edit_with_h5py(checkpoint,
                 "f.attrs['format_version'] = '1.0'; del f.attrs['finite']; del f.attrs['loss']; "
                 "del f['training'].attrs['applied_steps']");
  EXPECT_FALSE(checkpoint_health(checkpoint)) << "1.0 recorded no health";
  const std::optional<ResumeState> state = load_resume_state(checkpoint);
  ASSERT_TRUE(state);
  EXPECT_EQ(state->guard.applied_steps, state->guard.last_applied_step + 1);
  const auto resumed = resume(run_dir, 9);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("checkpoint.h5, from step 6 (healthy)"), std::string::npos) << resumed.output;
}

TEST_F(Recovery, AFormatOnePointSixCheckpointKeepsTheFallbacksLrCut) {
  // Before format 1.7 a checkpoint kept the rollbacks' LR cut alone
  // (@rollback_lr_multiplier): a resumed run whose fallback had fired must
  // still train at the cut LR, as the run did before its checkpoint.
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  const auto r = test::run_command(train(run_dir, "--steps 6 --checkpoint-every 3 --fault nonfinite_input@1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string checkpoint = run_dir + "/checkpoint.h5";
  const std::optional<ResumeState> now = load_resume_state(checkpoint);
  ASSERT_TRUE(now);
  ASSERT_EQ(now->guard.fallback_step, 1) << r.output;
  const double cut_lr = format::read_run(run_dir + "/run.h5").lr.back();
  ASSERT_LT(cut_lr, 0.01) << "the fallback cut the LR";
  edit_with_h5py(checkpoint,
                 "f.attrs['format_version'] = '1.6'; t = f['training']; "
                 "t.attrs['rollback_lr_multiplier'] = 1.0; del t.attrs['lr_multiplier']");
  const std::optional<ResumeState> old = load_resume_state(checkpoint);
  ASSERT_TRUE(old);
  EXPECT_TRUE(old->guard.lr_multiplier_lacks_fallback);
  const auto resumed = resume(run_dir, 9);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const format::RunData run = format::read_run(run_dir + "/run.h5");
  ASSERT_EQ(run.rows(), 9u);
  for (size_t i = 6; i < 9; ++i) EXPECT_DOUBLE_EQ(run.lr[i], cut_lr) << "step " << run.step[i];
}
