// A TorchScript model written by Debian's python3-torch trains in C++.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "../subprocess.hpp"
#include "../test_paths.hpp"
#include "nanscope/format/run_file.hpp"
#include "trainer.hpp"

using namespace nanscope;

class TorchScript : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    auto r = test::run_command(std::string(NANSCOPE_PYTHON) + " " + NANSCOPE_FIXTURES +
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

TEST_F(TorchScript, ModelFaultsNeedABuiltInModel) {
  TrainOptions o = options("bad");
  o.faults = {parse_fault("log_nonpositive@1")};
  EXPECT_THROW(run(o, std::cerr), std::invalid_argument);
}
