// nanscope-train as a user runs it: flags, exit codes, files on disk.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "../support/test_support.hpp"

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/trainer/options.hpp"

using nanscope::test::run_command;
using nanscope::test::TempDir;
using nanscope::test::TmpfsMount;

namespace {

const std::string kTrain = nanscope::test::paths::train_exe;

}  // namespace

TEST(Cli, HelpExplainsTheFlagsAndExitsZero) {
  auto r = run_command(kTrain + " --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--model", "--amp", "--lr-backoff", "--fault", "--probe", "--no-shuffle", "--config"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  EXPECT_NE(r.output.find("Usage: nanscope-train [OPTIONS]"), std::string::npos) << "the program's name";
  // Word options list their words and show their default as a word; CLI11's
  // own rendering of an enum mapping printed raw control bytes (--amp ... bf16->^A).
  // (CLI11 2.1 writes a default as "=off", 2.4 as " [off]".)
  auto line_of = [&](const std::string& flag) {
    const size_t at = r.output.find(flag);
    return at == std::string::npos ? std::string() : r.output.substr(at, r.output.find('\n', at) - at);
  };
  const std::string amp = line_of("--amp off|bf16|fp16");
  EXPECT_TRUE(amp.find("=off") != std::string::npos || amp.find("[off]") != std::string::npos) << r.output;
  const std::string probe = line_of("--probe on|off");
  EXPECT_TRUE(probe.find("=on") != std::string::npos || probe.find("[on]") != std::string::npos) << r.output;
  const auto control =
      std::find_if(r.output.begin(), r.output.end(), [](char c) { return (unsigned char)c < 0x20 && c != '\n'; });
  EXPECT_EQ(control, r.output.end()) << "a control byte at offset " << (control - r.output.begin());
}

TEST(Cli, ASkipWithAFiniteLossSaysTheGradientsWereNotFinite) {
  // sqrt of an all-zero RMS: finite forward and loss, Inf in its backward. The
  // progress line must not call the step's own finite loss "skipped; last finite ...".
  test::TempDir dir;
  auto r = run_command(kTrain + " --config " + std::string(nanscope::test::paths::samples) +
                       "/faults/p08-sqrt-grad-zero.toml --steps 7 --threads 1 --run-dir " + dir.file("run"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(skipped: gradients non-finite)"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("(skipped; last finite"), std::string::npos) << r.output;
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
  std::ofstream(dir.file("train.toml"))
      << "model = \"mlp\"\nsteps = 3\nbatch-size = 8\nlr = 0.002\nrollback-every = 7\ncapture = \"every-step\"\n";
  auto r = run_command(kTrain + " --config " + dir.file("train.toml") + " --quiet --run-dir " + dir.file("r"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = nanscope::format::read_run(dir.file("r/run.h5"));
  EXPECT_EQ(run.rows(), 3u);
  EXPECT_EQ(run.config.at("model"), "mlp");
  EXPECT_EQ(run.config.at("batch_size"), "8");
  EXPECT_DOUBLE_EQ(run.lr[0], 0.002);
  // The guard's options, each under its name, as set or by nanscope-train's defaults.
  for (const auto& option : nanscope::guard_option_list()) EXPECT_EQ(run.config.count(option.name), 1u) << option.name;
  EXPECT_EQ(run.config.at("rollback_every"), "7");
  EXPECT_EQ(run.config.at("capture"), "every-step");
  EXPECT_EQ(run.config.at("clip"), "1");
}

TEST(Cli, AnOptionsFileFromBeforeTheOptionListStillReads) {
  // nanscope-train used to write a word option's value into options.toml as
  // its number (amp bf16 as "1"); --resume of such a run reads it back.
  TempDir dir;
  std::ofstream(dir.file("options.toml"))
      << "model = \"mlp\"\nsteps = \"2\"\namp = \"1\"\nfallback = \"2\"\nrollback = \"0\"\ncapture = \"0\"\n";
  auto r =
      run_command(kTrain + " --config " + dir.file("options.toml") + " --quiet --threads 1 --run-dir " + dir.file("r"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto run = nanscope::format::read_run(dir.file("r/run.h5"));
  EXPECT_EQ(run.config.at("amp"), "bf16");
  EXPECT_EQ(run.config.at("fallback"), "auto");
  EXPECT_EQ(run.config.at("rollback"), "off");
  EXPECT_EQ(run.config.at("capture"), "on-failure");
}

TEST(Cli, EveryGuardOptionIsAFlagWithItsDefault) {
  auto r = run_command(kTrain + " --help");
  ASSERT_EQ(r.exit_code, 0);
  for (const auto& option : nanscope::guard_option_list()) {
    const std::string flag = nanscope::spelled(option, nanscope::OptionSpelling::flag);
    const std::string shown = option.text(nanscope::trainer::TrainOptions{});
    // The option's own line: the flag first on it, in the left column (CLI11 2.1
    // puts it at column 2, 2.6 at 10). CLI11 2.6 wraps descriptions into the
    // right column (30), so a line there may begin with this flag too.
    bool listed = false, with_default = false;
    for (size_t at = r.output.find("  " + flag + " "); at != std::string::npos;
         at = r.output.find("  " + flag + " ", at + 1)) {
      const size_t line_start = r.output.rfind('\n', at) + 1;
      if (r.output.find_first_not_of(' ', line_start) != at + 2 || at + 2 - line_start >= 16) continue;
      listed = true;
      const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
      with_default |= line.find("=" + shown) != std::string::npos || line.find("[" + shown + "]") != std::string::npos;
    }
    ASSERT_TRUE(listed) << flag << "\n" << r.output;
    if (shown.empty()) continue;  // --fp32-modules: none
    EXPECT_TRUE(with_default) << flag << " [" << shown << "]\n" << r.output;
  }
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

// A run killed with SIGKILL and resumed reaches the same weights, bit for
// bit, as the same run uninterrupted (CPU, fp32, one thread); its run.h5 has
// every step once; and plain HDF5 readers, which refuse the killed run's
// file, open it after the resume.
TEST(Cli, ResumeAfterSigkillReachesTheUninterruptedRunsWeightsBitForBit) {
  TempDir dir;
  const std::vector<std::string> args{"--model", "mlp",       "--steps", "3000",    "--checkpoint-every",
                                      "100",     "--threads", "1",       "--quiet", "--run-dir"};
  auto argv_for = [&](const std::string& run_dir) {
    std::string line = kTrain;
    for (const auto& a : args) line += " " + a;
    return line + " " + run_dir;
  };
  auto whole = run_command(argv_for(dir.file("whole")));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  // Killed at its second checkpoint's write (step 199 of 3000), mid-write:
  // deterministically before the end, however busy the machine (the run
  // takes well under a second quiet, so a kill timed by polling its rows
  // could land after its last step).
  const std::string killed = dir.file("killed");
  std::vector<std::string> killed_argv{kTrain};
  for (const auto& a : args) killed_argv.push_back(a);
  killed_argv.push_back(killed);
  ASSERT_EQ(nanscope::test::kill_at_second_checkpoint(killed_argv, dir.file("mid-write")), "");
  const std::string plain_open =
      std::string(nanscope::test::paths::python) + " -c \"import h5py, sys; h5py.File(sys.argv[1], 'r')\" ";
  EXPECT_NE(run_command(plain_open + killed + "/run.h5").exit_code, 0)
      << "a killed SWMR writer's file should need clearing";
  const size_t seen = nanscope::format::read_run(killed + "/run.h5").rows();
  ASSERT_GE(seen, 100u) << "the first checkpoint came after step 99";
  ASSERT_LT(seen, 3000u) << "the run finished before the kill";

  auto resumed = run_command(kTrain + " --resume " + killed);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resume: " + killed + "/checkpoint.h5, from step "), std::string::npos)
      << resumed.output;
  EXPECT_EQ(run_command(plain_open + killed + "/run.h5").exit_code, 0) << "plain readers open it after the resume";

  const auto a = nanscope::format::read_run(dir.file("whole/run.h5"));
  const auto b = nanscope::format::read_run(killed + "/run.h5");
  ASSERT_EQ(b.rows(), 3000u) << "every step once: the rows after the checkpoint were dropped and redone";
  for (size_t i = 0; i < b.rows(); ++i) {
    ASSERT_EQ(b.step[i], int64_t(i));
    ASSERT_EQ(b.loss[i], a.loss[i]) << "step " << i;  // bit for bit, the steps before the kill and after
  }
  // What the resumed run wrote and where, shown if the resume event is missing.
  std::string events, files;
  for (const auto& e : b.events)
    events += std::to_string(e.step) + " " + nanscope::format::to_string(e.kind) + ": " + e.text + "\n";
  for (const auto& f : std::filesystem::directory_iterator(killed)) files += f.path().filename().string() + " ";
  EXPECT_EQ(nanscope::test::event_lines(b, format::EventKind::resume).size(), 1u)
      << "events:\n"
      << events << "files: " << files << "\nthe resume printed:\n"
      << resumed.output;
  // The final weights: both runs' last checkpoints, read through h5py, byte for byte.
  const std::string compare =
      std::string(nanscope::test::paths::python) +
      " -c \"import h5py, sys, numpy as np\n"
      "a, b = (h5py.File(p, 'r') for p in sys.argv[1:3])\n"
      "names = []\n"
      "a['parameters'].visit(lambda n: names.append(n) if isinstance(a['parameters'][n], h5py.Dataset) else None)\n"
      "assert names\n"
      "for n in names: assert np.array_equal(a['parameters'][n][()], b['parameters'][n][()]), n\n"
      "assert a.attrs['step'] == b.attrs['step'] == 3000\n"
      "print(len(names), 'tensors equal')\" ";
  auto same = run_command(compare + dir.file("whole/checkpoint.h5") + " " + killed + "/checkpoint.h5");
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

// The disk fills while run.h5 is appended: the run stops cleanly (exit 1,
// one line naming run.h5), and every row written before reads back.
TEST(Cli, FullDiskWhileAppendingTheRunFileStopsCleanlyWithTheRowsSoFarReadable) {
  TempDir dir;
  const std::string full = dir.file("full");
  std::filesystem::create_directories(full);
  const TmpfsMount disk(full, "256k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto r = run_command(kTrain + " --model mlp --steps 1000000 --quiet --threads 1 --run-dir " + full + "/run");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(full + "/run/run.h5"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("disk full"), std::string::npos) << r.output;
  const auto run = nanscope::format::read_run(full + "/run/run.h5");
  EXPECT_GT(run.rows(), 100u) << "the rows before the disk filled";
  for (size_t i = 0; i < run.rows(); ++i) ASSERT_EQ(run.step[i], int64_t(i));
}

// The disk fills while a periodic checkpoint is written: that checkpoint is
// not written (a line, an event), training goes on to its last step with
// every row in run.h5, and the run's last save, which cannot be written
// either, is the run's failure (exit 1, naming the file). HDF5 2.x aborts the
// process where it cannot write a file's metadata: the archive checks for room
// first, so this holds on HDF5 1.10 and 2.x alike.
TEST(Cli, FullDiskWhileACheckpointIsWrittenLeavesTrainingRunning) {
  TempDir dir;
  const std::string full = dir.file("full");
  std::filesystem::create_directories(full);
  const TmpfsMount disk(full, "1m");  // run.h5 fits, a 5 MiB checkpoint does not
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto r = run_command(kTrain +
                       " --model gpt --n-layer 2 --n-embd 128 --seq-len 16 --batch-size 1 --steps 6"
                       " --checkpoint-every 2 --quiet --threads 1 --save " +
                       full + "/ckpt.h5 --run-dir " + full + "/run");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("checkpoint after step 1 not written"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checkpoint after step 3 not written"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("disk full"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Assertion"), std::string::npos) << r.output;
  const auto run = nanscope::format::read_run(full + "/run/run.h5");
  ASSERT_EQ(run.rows(), 6u) << "training went on after the failed checkpoints";
  EXPECT_FALSE(std::filesystem::exists(full + "/ckpt.h5.part")) << "a failed write leaves nothing behind";
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
