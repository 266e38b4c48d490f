// nanscope-train as a user runs it: flags, exit codes, files on disk.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "../subprocess.hpp"
#include "../test_paths.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/probe/torch_compat.hpp"

using nanscope::test::run_command;
using nanscope::test::TempDir;

namespace {

const std::string kTrain = NANSCOPE_TRAIN_EXE;

}  // namespace

TEST(Cli, HelpExplainsTheFlagsAndExitsZero) {
  auto r = run_command(kTrain + " --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--model", "--amp", "--lr-backoff", "--fault", "--probe", "--no-shuffle", "--config"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

TEST(Cli, BadArgumentsExitTwoWithAMessage) {
  auto amp = run_command(kTrain + " --amp fp8");
  EXPECT_EQ(amp.exit_code, 2);
  EXPECT_NE(amp.output.find("--amp"), std::string::npos) << amp.output;
  auto steps = run_command(kTrain + " --steps 0");
  EXPECT_EQ(steps.exit_code, 2);
  auto fault = run_command(kTrain + " --fault bogus@1");
  EXPECT_EQ(fault.exit_code, 2);
  EXPECT_NE(fault.output.find("unknown fault kind 'bogus'"), std::string::npos) << fault.output;
  auto late = run_command(kTrain + " --steps 5 --fault exp_overflow@9");
  EXPECT_EQ(late.exit_code, 2);
  EXPECT_NE(late.output.find("past the last step"), std::string::npos) << late.output;
}

TEST(Cli, BadNumbersAndUnknownConfigKeysExitTwoNamingThem) {
  for (const char* args : {" --lr nan", " --lr -1", " --lr inf", " --steps 0", " --clip nan", " --weight-decay -0.1"}) {
    auto r = run_command(kTrain + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    const std::string flag = std::string(args).substr(1, std::string(args).find(' ', 1) - 1);
    EXPECT_NE(r.output.find(flag + ": must be a"), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("1797693"), std::string::npos) << "no range up to DBL_MAX:\n" << r.output;
  }
  auto backoff = run_command(kTrain + " --lr-backoff nan");
  EXPECT_EQ(backoff.exit_code, 2) << backoff.output;
  nanscope::test::TempDir dir;
  {
    std::ofstream config(dir.file("run.toml"));
    config << "steps = 5\nbogus_key = 3\n";
  }
  auto r = run_command(kTrain + " --config " + dir.file("run.toml") + " --run-dir " + dir.file("r"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bogus_key"), std::string::npos) << r.output;
}

TEST(Cli, MissingOrForeignDataFileExitsTwoNamingIt) {
  TempDir dir;
  auto missing =
      run_command(kTrain + " --model mlp --steps 2 --run-dir " + dir.file("r") + " --data " + dir.file("absent.h5"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find(dir.file("absent.h5")), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("no such file"), std::string::npos) << missing.output;
  std::ofstream(dir.file("text.h5")) << "not hdf5";
  auto foreign =
      run_command(kTrain + " --model mlp --steps 2 --run-dir " + dir.file("r") + " --data " + dir.file("text.h5"));
  EXPECT_EQ(foreign.exit_code, 2);
  EXPECT_NE(foreign.output.find("not an HDF5 file"), std::string::npos) << foreign.output;
}

TEST(Cli, UnavailablePrecisionExitsTwo) {
  if (nanscope::compat::autocast_supported(c10::kCPU, at::kHalf)) GTEST_SKIP() << "fp16 CPU autocast exists here";
  TempDir dir;
  auto r = run_command(kTrain + " --model mlp --steps 2 --amp fp16 --device cpu --run-dir " + dir.file("r"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bf16 only on CPU"), std::string::npos) << r.output;
}

TEST(Cli, FaultTheModelCannotHostExitsTwo) {
  TempDir dir;
  auto r = run_command(kTrain + " --model gpt --steps 2 --fault nonfinite_input@0 --run-dir " + dir.file("r"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("needs float inputs"), std::string::npos) << r.output;
}

TEST(Cli, ConfigFileSetsOptionsAndRunConfigIsRecorded) {
  TempDir dir;
  std::ofstream(dir.file("train.toml")) << "model = \"mlp\"\nsteps = 3\nbatch-size = 8\nlr = 0.002\n";
  auto r = run_command(kTrain + " --config " + dir.file("train.toml") + " --quiet --run-dir " + dir.file("r"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = nanscope::format::read_run(dir.file("r/run.h5"));
  EXPECT_EQ(run.rows(), 3u);
  EXPECT_EQ(run.config.at("model"), "mlp");
  EXPECT_EQ(run.config.at("batch_size"), "8");
  EXPECT_DOUBLE_EQ(run.lr[0], 0.002);
}

TEST(Cli, SaveThenInitFineTunesFromTheCheckpoint) {
  TempDir dir;
  auto first = run_command(kTrain + " --model mlp --steps 30 --quiet --lr 3e-3 --run-dir " + dir.file("a") +
                           " --save " + dir.file("ckpt.h5"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto second = run_command(kTrain + " --model mlp --steps 2 --quiet --lr 3e-3 --run-dir " + dir.file("b") +
                            " --init " + dir.file("ckpt.h5"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  auto a = nanscope::format::read_run(dir.file("a/run.h5"));
  auto b = nanscope::format::read_run(dir.file("b/run.h5"));
  EXPECT_LT(b.loss[0], a.loss[0] * 0.9) << "the fine-tune starts from the trained weights";
  auto wrong =
      run_command(kTrain + " --model gpt --steps 2 --run-dir " + dir.file("c") + " --init " + dir.file("ckpt.h5"));
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_NE(wrong.output.find("holds a 'mlp' model"), std::string::npos) << wrong.output;
}

TEST(Cli, RunFileIsReadableWhileWrittenAndAfterSigkill) {
  TempDir dir;
  const std::string run_file = dir.file("r/run.h5");
  const pid_t child = fork();
  if (child == 0) {
    execl(kTrain.c_str(), kTrain.c_str(), "--model", "mlp", "--steps", "1000000", "--quiet", "--threads", "1",
          "--run-dir", dir.file("r").c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  size_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (seen < 64 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    try {
      const size_t rows = nanscope::format::read_run(run_file).rows();
      EXPECT_GE(rows, seen) << "rows never disappear";
      seen = rows;
    } catch (const nanscope::format::FormatError&) {
      // Not created yet.
    }
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_GE(seen, 64u) << "the live run never showed 64 rows";
  auto run = nanscope::format::read_run(run_file);
  EXPECT_GE(run.rows(), seen);
  for (size_t i = 0; i < run.rows(); ++i) ASSERT_EQ(run.step[i], int64_t(i));
}
