// Data-parallel nanscope-train: real processes on 127.0.0.1 over c10d Gloo,
// launched the way torchrun launches them (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT in the environment). Every wait here is bounded, so a hang is a
// failure, never a stuck CI.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "../support/test_support.hpp"

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/state_health.hpp"
#include "nanscope/format/event_text.hpp"
#include "nanscope/format/poison_list.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/models/fault.hpp"
#include "nanscope/models/scripted_model.hpp"
#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/setup.hpp"

namespace nanscope {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::TempDir;
using namespace trainer;

// A port nothing listens on right now (the kernel's pick for port 0).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Rank {
  pid_t pid = -1;
  int exit_code = -1;
  std::string log;  // stdout + stderr
};

// N copies of nanscope-train, one per rank, each with its log in DIR/rank-R.log;
// `rank_env[r]`, where given, is rank r's own environment (VAR=VALUE ...).
class Job {
 public:
  Job(const TempDir& dir, int world, const std::string& args, int port = free_port(),
      const std::vector<std::string>& rank_env = {})
      : dir_(dir) {
    for (int r = 0; r < world; ++r) {
      const std::string log = dir.file("rank-" + std::to_string(r) + ".log");
      const std::string own = size_t(r) < rank_env.size() ? rank_env[r] + " " : std::string();
      const std::string command = "exec env " + own + "RANK=" + std::to_string(r) +
                                  " WORLD_SIZE=" + std::to_string(world) + " LOCAL_RANK=" + std::to_string(r) +
                                  " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
                                  test::paths::train_exe + " " + args + " >" + log + " 2>&1";
      const pid_t pid = fork();
      if (pid == 0) {
        execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
        _exit(127);
      }
      ranks_.push_back({pid, -1, ""});
    }
  }
  ~Job() {
    for (auto& r : ranks_)
      if (r.exit_code < 0 && r.pid > 0) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
      }
  }
  // Waits up to `limit` for rank r; false (and the rank killed) if it is still running.
  bool wait(int r, std::chrono::seconds limit) {
    Rank& rank = ranks_[r];
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (rank.exit_code < 0) {
      int status = 0;
      if (waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    std::ifstream in(dir_.file("rank-" + std::to_string(r) + ".log"));
    rank.log.assign(std::istreambuf_iterator<char>(in), {});
    return true;
  }
  bool wait_all(std::chrono::seconds limit) {
    bool all = true;
    for (size_t r = 0; r < ranks_.size(); ++r) all = wait(int(r), limit) && all;
    return all;
  }
  Rank& operator[](int r) { return ranks_[r]; }

 private:
  const TempDir& dir_;
  std::vector<Rank> ranks_;
};

std::string mlp_args(const std::string& run_dir, int steps, int batch) {
  return "--model mlp --lr 3e-3 --steps " + std::to_string(steps) + " --batch-size " + std::to_string(batch) +
         " --threads 1 --quiet --run-dir " + run_dir;
}

std::vector<std::pair<std::string, at::Tensor>> mlp_weights(const std::string& checkpoint) {
  TrainOptions o;
  o.model = "mlp";
  std::unique_ptr<TrainableModel> model = make_model(o, make_dataset(o));
  load_checkpoint(checkpoint, *model);
  return model->named_parameters();
}

format::RunData rank_run(const std::string& run_dir, int rank, int world) {
  return format::read_run((fs::path(run_dir) / format::run_file_name(rank, world)).string());
}

std::string rank_checkpoint(const std::string& run_dir, int rank) {
  return (fs::path(run_dir) / ("checkpoint-rank-" + std::to_string(rank) + ".h5")).string();
}

// Rows of a live rank's run file once it has `rows` (or after a minute: fewer).
size_t wait_for_rows(const std::string& run_dir, int rank, int world, size_t rows) {
  const std::string file = (fs::path(run_dir) / format::run_file_name(rank, world)).string();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  size_t seen = 0;
  while (seen < rows && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    try {
      seen = format::read_run(file).rows();
    } catch (const std::exception&) {  // not created yet
    }
  }
  return seen;
}

TEST(DataParallelSampler, RanksTogetherReadExactlyTheGlobalBatchOfOneProcess) {
  for (bool shuffle : {false, true}) {
    const int world = 4, batch = 5;
    BatchSampler single(97, batch * world, shuffle, 7);
    std::vector<BatchSampler> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(97, batch, shuffle, 7, r, world);
    for (int64_t step : {0, 1, 4, 19, 20, 55}) {
      std::vector<at::Tensor> parts;
      for (const auto& s : ranks) parts.push_back(s.rows(step));
      EXPECT_TRUE(at::equal(at::cat(parts), single.rows(step))) << "step " << step << " shuffle " << shuffle;
      EXPECT_FALSE(at::equal(parts[0], parts[1])) << "ranks must read different rows";
    }
  }
}

TEST(DataParallelFaults, RankSuffixPlantsOnThatRankOnly) {
  const Fault f = parse_fault("log_nonpositive@6/rank1");
  EXPECT_EQ(f.kind, FaultKind::log_nonpositive);
  EXPECT_EQ(f.step, 6);
  EXPECT_EQ(f.rank, 1);
  const Fault every = parse_fault("lr_spike@3:10");
  EXPECT_EQ(every.rank, -1);
  EXPECT_EQ(faults_on_rank({f, every}, 0).size(), 1u);
  ASSERT_EQ(faults_on_rank({f, every}, 1).size(), 2u);
  EXPECT_EQ(faults_on_rank({f, every}, 1)[0].rank, -1);  // a rank's own config names no rank
  EXPECT_THROW(parse_fault("log_nonpositive@6/rankX"), std::invalid_argument);
  EXPECT_THROW(parse_fault("log_nonpositive@6/rank-1"), std::invalid_argument);
}

// The guard adds no round to a clean step: its flags (each rank's
// finiteness, the loss) ride at the end of the last gradient bucket, so a
// step issues exactly the collectives a plain data-parallel step does, one
// per bucket, whether the model fits one bucket or is split into several.
TEST(DataParallel, ACleanStepIssuesOneCollectivePerGradientBucketAndNoMore) {
  const int world = 2;
  TempDir dir;
  const std::regex summary(R"(([0-9]+) collective\(s\) per step \(median\) for ([0-9]+) gradient bucket\(s\))");
  for (const char* bucket_mb : {"25", "0.0001"}) {
    Job job(dir, world, mlp_args(dir.file(std::string("buckets-") + bucket_mb), 6, 8) + " --bucket-mb " + bucket_mb);
    ASSERT_TRUE(job.wait_all(120s)) << "a rank did not finish";
    for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
    std::smatch found;
    ASSERT_TRUE(std::regex_search(job[0].log, found, summary)) << job[0].log;
    const int collectives = std::stoi(found[1]), buckets = std::stoi(found[2]);
    EXPECT_EQ(collectives, buckets) << "--bucket-mb " << bucket_mb << ":\n" << job[0].log;
    if (std::string(bucket_mb) == "0.0001") EXPECT_GT(buckets, 1) << "each parameter its own bucket";
  }
}

class DataParallelRun : public ::testing::TestWithParam<int> {};

// Same data, same steps: W ranks with batch B must train like one process
// with batch W x B (the gradient average is the global batch's gradient), and
// every rank must hold the same weights at the end.
TEST_P(DataParallelRun, RanksAgreeBitForBitAndFollowOneProcessWithTheSummedBatch) {
  const int world = GetParam(), batch = 8, steps = 12;
  TempDir dir;
  Job job(dir, world, mlp_args(dir.file("dp"), steps, batch) + " --save " + dir.file("rank{rank}.h5"));
  ASSERT_TRUE(job.wait_all(120s)) << "a rank did not finish";
  for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
  EXPECT_NE(job[0].log.find("ranks: " + std::to_string(world) + ", median all-reduce"), std::string::npos)
      << job[0].log;

  const std::string single_dir = dir.file("single");
  const auto single =
      test::run_command(std::string(test::paths::train_exe) + " " + mlp_args(single_dir, steps, batch * world) +
                        " --save " + dir.file("single.h5"));
  ASSERT_EQ(single.exit_code, 0) << single.output;

  const auto weights0 = mlp_weights(dir.file("rank0.h5"));
  for (int r = 1; r < world; ++r) {
    const auto weights = mlp_weights(dir.file("rank" + std::to_string(r) + ".h5"));
    ASSERT_EQ(weights.size(), weights0.size());
    for (size_t i = 0; i < weights.size(); ++i)
      EXPECT_TRUE(at::equal(weights[i].second, weights0[i].second)) << "rank " << r << " " << weights[i].first;
  }
  const auto weights_single = mlp_weights(dir.file("single.h5"));
  for (size_t i = 0; i < weights0.size(); ++i) {
    EXPECT_TRUE(at::allclose(weights0[i].second, weights_single[i].second, 1e-4, 1e-5))
        << weights0[i].first << " max diff "
        << (weights0[i].second - weights_single[i].second).abs().max().item<double>();
  }

  // The loss curve: the mean of the ranks' losses is the global batch's loss.
  const format::RunData one = format::read_run(single_dir + "/run.h5");
  std::vector<format::RunData> runs;
  for (int r = 0; r < world; ++r) runs.push_back(rank_run(dir.file("dp"), r, world));
  ASSERT_EQ(one.rows(), size_t(steps));
  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (const auto& run : runs) {
      ASSERT_EQ(run.rows(), size_t(steps));
      mean += run.loss[s] / world;
      EXPECT_EQ(run.grad_norm[s], runs[0].grad_norm[s]) << "the global norm differs between ranks at step " << s;
    }
    EXPECT_NEAR(mean, one.loss[s], 1e-5 * std::abs(one.loss[s])) << "step " << s;
    EXPECT_NEAR(runs[0].grad_norm[s], one.grad_norm[s], 1e-4 * one.grad_norm[s]) << "step " << s;
  }
  EXPECT_LT(one.loss.back(), one.loss.front()) << "the run should learn something";
  EXPECT_EQ(runs[1].config.at("rank"), "1");
  EXPECT_EQ(runs[1].config.at("world_size"), std::to_string(world));
}

INSTANTIATE_TEST_SUITE_P(Gloo, DataParallelRun, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// A NaN born on rank 1 only: every rank skips that step and falls back
// together, rank 1 (and only rank 1) investigates and names the birth, the
// others' lines and every rank's file say rank 1 went first, and the snapshot
// replays on one process.
TEST(DataParallel, NanOnRankOneOnlyEveryRankSkipsAndRankOneNamesTheBirth) {
  const int world = 4, fault_step = 6, steps = 10;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world,
          mlp_args(run_dir, steps, 8) + " --amp bf16 --fault log_nonpositive@" + std::to_string(fault_step) + "/rank1");
  ASSERT_TRUE(job.wait_all(120s));
  for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
  EXPECT_NE(job[1].log.find("[rank 1] step 6: first birth: nan at aten::log (forward) in module 'fc1'"),
            std::string::npos)
      << job[1].log;
  // Rank 0 had nothing to investigate (no snapshot, below): its line gives
  // rank 1's birth itself, with the rank it was born on.
  EXPECT_NE(job[0].log.find("[rank 0] step 6: first birth: nan at aten::log (forward) in module 'fc1'"),
            std::string::npos)
      << job[0].log;
  EXPECT_NE(job[0].log.find(", on rank 1; born on rank(s) 1, not on rank 0 (run-rank-1.h5 has the rest)"),
            std::string::npos)
      << job[0].log;

  for (int r = 0; r < world; ++r) {
    const format::RunData run = rank_run(run_dir, r, world);
    ASSERT_EQ(run.rows(), size_t(steps)) << "rank " << r;
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(run.skipped[s], s == fault_step ? 1 : 0) << "rank " << r << " step " << s;
      // The one-shot fallback fires on every rank at the same step.
      EXPECT_EQ(run.amp[s], s <= fault_step ? 1 : 0) << "rank " << r << " step " << s;
    }
    EXPECT_EQ(test::event_lines(run, format::EventKind::first_nonfinite), std::vector<std::string>{"6: 1"})
        << "rank " << r;
    EXPECT_EQ(test::event_lines(run, format::EventKind::fallback).size(), 1u) << "rank " << r;
    // Per-layer norms are the rank's own gradients: NaN on rank 1 only.
    const size_t layers = run.layer_names.size();
    ASSERT_GT(layers, 0u);
    bool nan_in_row = false;
    for (size_t l = 0; l < layers; ++l) nan_in_row |= std::isnan(run.layer_grad_norm[fault_step * layers + l]);
    EXPECT_EQ(nan_in_row, r == 1) << "rank " << r;
    EXPECT_EQ(test::event_lines(run, format::EventKind::snapshot).size(), r == 1 ? 1u : 0u) << "rank " << r;
  }
  // Every rank's file holds the birth as rank 1 said it.
  const std::vector<std::string> born = test::event_lines(rank_run(run_dir, 1, world), format::EventKind::first_birth);
  ASSERT_EQ(born.size(), 1u);
  for (int r : {0, 2, 3})
    EXPECT_EQ(test::event_lines(rank_run(run_dir, r, world), format::EventKind::first_birth),
              std::vector<std::string>{born[0] + ", on rank 1; born on rank(s) 1, not on rank " + std::to_string(r) +
                                       " (run-rank-1.h5 has the rest)"});

  const std::string snapshot = (fs::path(run_dir) / "snapshots" / "rank-1" / "step-0000006.h5").string();
  ASSERT_TRUE(fs::exists(snapshot));
  for (int r : {0, 2, 3}) EXPECT_FALSE(fs::exists(fs::path(run_dir) / "snapshots" / ("rank-" + std::to_string(r))));
  const format::SnapshotSummary summary = format::read_snapshot_summary(snapshot);
  ASSERT_TRUE(summary.capture.first_birth.has_value());
  EXPECT_EQ(summary.capture.first_birth->op.op, "aten::log");
  EXPECT_EQ(summary.capture.first_birth->op.module, "fc1");
  EXPECT_EQ(summary.config.at("rank"), "1");
  EXPECT_EQ(summary.config.at("faults"), "log_nonpositive@6:0");  // the rank's own fault, no rank in it

  // Replay needs no process group: one process, the snapshot alone.
  const auto replay = test::run_command(std::string(test::paths::replay_exe) + " " + snapshot + " --json --repeats 1");
  EXPECT_EQ(replay.exit_code, 0) << replay.output;
  EXPECT_NE(replay.output.find("\"verdict\": \"model_or_data\""), std::string::npos) << replay.output;
}

// --fallback auto on several ranks decides as one process does. The rank
// whose batch failed diagnoses the step; every rank carries out that one
// remedy, worded alike, naming the rank whose diagnosis it is.
struct AutoOnRanks {
  std::string model;
  std::string fault;   // planted on rank 1 at step 6
  std::string remedy;  // how every rank's remedy event at step 6 begins
};

class DataParallelAutoFallback : public ::testing::TestWithParam<AutoOnRanks> {};

TEST_P(DataParallelAutoFallback, EveryRankCarriesOutTheRemedyOneProcessWouldChoose) {
  const int world = 2, steps = 10, fault_step = 6;
  TempDir dir;
  const std::string args = "--model " + GetParam().model + " --lr 1e-3 --steps " + std::to_string(steps) +
                           " --batch-size 8 --no-shuffle --threads 1 --quiet --amp bf16 --fault " + GetParam().fault +
                           "@" + std::to_string(fault_step) + "/rank1 --checkpoint-every 5";
  const std::string run_dir = dir.file("auto");
  Job job(dir, world, args + " --fallback auto --run-dir " + run_dir);
  ASSERT_TRUE(job.wait_all(180s));
  for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
  for (int r = 0; r < world; ++r) {
    const format::RunData run = rank_run(run_dir, r, world);
    ASSERT_EQ(run.rows(), size_t(steps)) << "rank " << r;
    const bool whole = GetParam().remedy.rfind("whole", 0) == 0;
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(run.skipped[s], s == fault_step ? 1 : 0) << "rank " << r << " step " << s;
      EXPECT_EQ(run.amp[s], whole && s > fault_step ? 0 : 1) << "rank " << r << " step " << s << ": precision";
    }
    const std::vector<std::string> remedies = test::event_lines(run, format::EventKind::remedy);
    ASSERT_EQ(remedies.size(), 1u) << "rank " << r;
    EXPECT_EQ(remedies[0].rfind(std::to_string(fault_step) + ": " + GetParam().remedy, 0), 0u)
        << "rank " << r << ": " << remedies[0];
    EXPECT_EQ(test::event_lines(run, format::EventKind::fallback).size(), whole ? 1u : 0u) << "rank " << r;
    // The modules every rank runs in fp32 from then on, as its checkpoint's guard state keeps them.
    const std::optional<ResumeState> state = load_resume_state(rank_checkpoint(run_dir, r));
    ASSERT_TRUE(state.has_value()) << "rank " << r;
    EXPECT_EQ(state->guard.fp32_modules, GetParam().remedy.rfind("fp32-modules", 0) == 0
                                             ? std::vector<std::string>{"blocks.0.ln1"}
                                             : std::vector<std::string>{})
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gloo, DataParallelAutoFallback,
    ::testing::Values(
        // A NaN in rank 1's sample 3: the data's, a skip and nothing more.
        AutoOnRanks{"mlp", "nonfinite_input", "data: rank 1: the batch holds a non-finite value; no fallback"},
        // bf16 alone (re-runs with autocast off, then with modules in fp32):
        // the module goes to fp32 on every rank, the rest stays bf16.
        AutoOnRanks{"gpt", "variance_cancellation", "fp32-modules: rank 1: blocks.0.ln1 now in fp32"},
        // 0/0 in fp32 too, with every sample (the fault is the model's): fp32
        // is shown not to help, so a skip and no fallback on every rank, as in
        // one process.
        AutoOnRanks{"gpt", "zero_variance_norm",
                    "model_or_data: rank 1: non-finite with autocast off too, whichever batch row is left out"}),
    [](const auto& info) { return std::string(info.param.fault); });

// A data fault on one rank of 2 or 4 costs a skip and nothing more: the run
// ends with the weights of the same run whose fallback is off (the stock
// skip), bit for bit on every rank.
class DataParallelAutoSkip : public ::testing::TestWithParam<int> {};

TEST_P(DataParallelAutoSkip, ADataFaultOnOneRankEndsAsTheSkipAloneOnEveryRank) {
  const int world = GetParam();
  TempDir dir;
  const std::string args =
      "--model mlp --lr 1e-3 --steps 10 --batch-size 8 --no-shuffle --threads 1 --quiet --amp bf16 "
      "--fault nonfinite_input@6:3/rank1";
  Job automatic(dir, world,
                args + " --fallback auto --run-dir " + dir.file("auto") + " --save " + dir.file("auto-{rank}.h5"));
  ASSERT_TRUE(automatic.wait_all(180s));
  Job off(dir, world, args + " --fallback off --run-dir " + dir.file("off") + " --save " + dir.file("off-{rank}.h5"));
  ASSERT_TRUE(off.wait_all(180s));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(automatic[r].exit_code, 0) << automatic[r].log;
    ASSERT_EQ(off[r].exit_code, 0) << off[r].log;
    EXPECT_EQ(test::event_lines(rank_run(dir.file("auto"), r, world), format::EventKind::first_nonfinite),
              std::vector<std::string>{"6: 1"})
        << "rank " << r << ": rank 1 went first";
    const auto a = mlp_weights(dir.file("auto-" + std::to_string(r) + ".h5"));
    const auto b = mlp_weights(dir.file("off-" + std::to_string(r) + ".h5"));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << "rank " << r << " " << a[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, DataParallelAutoSkip, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

// A corrupt sample that one rank meets is listed once, and every rank leaves
// it out of every later epoch: each rank's file has the one skip, at the same
// step, over four epochs (the global batch of 2 x 16 reads 4096 samples in
// 128 steps).
TEST(DataParallel, EveryRankLeavesOutTheSampleOneRankMet) {
  TempDir dir;
  Job job(dir, 2,
          "--model mlp --steps 512 --threads 1 --quiet --amp bf16 --fallback auto --fault corrupt_sample@0:5 "
          "--run-dir " +
              dir.file("run"));
  ASSERT_TRUE(job.wait_all(180s));
  std::vector<int64_t> skipped_at;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(job[r].exit_code, 0) << job[r].log;
    const format::RunData run = rank_run(dir.file("run"), r, 2);
    std::vector<int64_t> skipped;
    for (size_t i = 0; i < run.rows(); ++i)
      if (run.skipped[i]) skipped.push_back(run.step[i]);
    ASSERT_EQ(skipped.size(), 1u) << "rank " << r << ": " << job[r].log;
    skipped_at.push_back(skipped[0]);
  }
  EXPECT_EQ(skipped_at[0], skipped_at[1]);
  const std::vector<format::PoisonedSample> list = format::read_poison_list(dir.file("run/poisoned_samples.jsonl"));
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].row, 5);
  EXPECT_EQ(list[0].step, skipped_at[0]);
}

// The live search for the dooming step on several ranks of nanscope-train: a
// one-step LR pulse (finite, applied on every rank) wrecks the weights and
// the next step is non-finite. Every rank replays its own batches together
// (each replayed step's gradients averaged as the step's were) and every rank
// names the pulse's step, its whole update.
TEST(DataParallel, EveryRankSearchesTogetherAndNamesTheDoomingStep) {
  const int world = 2;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world,
          "--model gpt --n-layer 1 --n-embd 32 --amp bf16 --rollback off --doom-search on --rollback-every 10 "
          "--steps 20 --batch-size 8 --threads 1 --quiet --fault lr_pulse@15:1e12 --run-dir " +
              run_dir);
  ASSERT_TRUE(job.wait_all(180s));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
    const format::RunData run = rank_run(run_dir, r, world);
    const std::vector<std::string> dooms = test::event_lines(run, format::EventKind::doom);
    ASSERT_EQ(dooms.size(), 1u) << "rank " << r << ":\n" << job[r].log;
    EXPECT_EQ(dooms[0].rfind("15: step 15 doomed step 16: without its update the steps up to 16 stay finite", 0), 0u)
        << "rank " << r << ": " << dooms[0];
  }
}

// A BatchNorm model, a NaN sample on rank 1 only: every rank skips the step
// and every rank puts back the statistics its own forward wrote.
TEST(DataParallel, EveryRankRestoresItsBatchNormStatisticsOnASkip) {
  const int world = 2, steps = 12;
  TempDir dir;
  const auto fixtures = test::run_command(std::string(test::paths::python) + " " + test::paths::fixtures +
                                          "/make_scripted_model.py " + dir.path().string());
  ASSERT_EQ(fixtures.exit_code, 0) << fixtures.output;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world,
          "--model " + dir.file("batchnorm_classifier.pt") + " --data " + dir.file("classes_data.h5") +
              " --amp bf16 --steps " + std::to_string(steps) +
              " --batch-size 16 --threads 1 --quiet --fault nonfinite_input@5:3/rank1 --save " +
              dir.file("model-{rank}.h5") + " --run-dir " + run_dir);
  ASSERT_TRUE(job.wait_all(120s));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
    const format::RunData run = rank_run(run_dir, r, world);
    const auto skips = test::event_lines(run, format::EventKind::skip);
    ASSERT_EQ(skips.size(), 1u) << "rank " << r;
    EXPECT_NE(skips[0].find("buffers restored: bn.running_mean, bn.running_var, bn.num_batches_tracked"),
              std::string::npos)
        << "rank " << r << ": " << skips[0];
    auto model = load_scripted_model(dir.file("batchnorm_classifier.pt"));
    load_checkpoint(dir.file("model-" + std::to_string(r) + ".h5"), *model);
    EXPECT_TRUE(state_health(*model, nullptr).finite()) << "rank " << r;
    for (const auto& [name, t] : model->named_buffers()) {
      if (name == "bn.num_batches_tracked") {
        EXPECT_EQ(t.item<int64_t>(), steps - 1) << "rank " << r;
      }
    }
  }
}

// fp16: the loss scaler sees every rank's overflow, so a fault on one rank
// backs the scale off on all of them, and the scale stays identical.
TEST(DataParallel, Fp16LossScaleBacksOffTogetherAndStaysIdentical) {
  if (!compat::autocast_supported(c10::kCPU, at::kHalf)) GTEST_SKIP() << "fp16 CPU autocast needs LibTorch 2.x";
  const int world = 2, fault_step = 4, steps = 8;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world,
          "--model mlp --batch-size 8 --steps " + std::to_string(steps) +
              " --amp fp16 --fallback off --threads 1 --quiet --run-dir " + run_dir + " --fault activation_overflow@" +
              std::to_string(fault_step) + "/rank1");
  ASSERT_TRUE(job.wait_all(120s));
  for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
  const format::RunData rank0 = rank_run(run_dir, 0, world), rank1 = rank_run(run_dir, 1, world);
  ASSERT_EQ(rank0.rows(), size_t(steps));
  ASSERT_EQ(rank1.rows(), size_t(steps));
  for (int s = 0; s < steps; ++s) {
    EXPECT_EQ(rank0.loss_scale[s], rank1.loss_scale[s]) << "step " << s;
    EXPECT_EQ(rank0.skipped[s], s == fault_step ? 1 : 0) << "step " << s;
    EXPECT_EQ(rank1.skipped[s], s == fault_step ? 1 : 0) << "step " << s;
  }
  EXPECT_EQ(rank0.loss_scale[fault_step + 1], rank0.loss_scale[fault_step] / 2);
  EXPECT_EQ(test::event_lines(rank0, format::EventKind::first_nonfinite), std::vector<std::string>{"4: 1"});
}

// A rank killed mid-run: the survivors end with a clear error (exit 3) within
// seconds, not at the collective timeout and never hung, and every rank's
// run file stays readable with its steps.
// A fault on rank 1 alone, two steps running: every rank rolls back to the
// same saved state at the same step, warns alike (the signals are the
// averaged ones), and the weights stay identical.
TEST(DataParallel, RanksRollBackTogetherAndWarnAlike) {
  const int world = 2, steps = 40;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world,
          mlp_args(run_dir, steps, 8) +
              " --amp bf16 --rollback-every 10 --fault log_nonpositive@30/rank1 --fault log_nonpositive@31/rank1 "
              "--save " +
              dir.file("rank{rank}.h5"));
  ASSERT_TRUE(job.wait_all(120s));
  for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << "rank " << r << ":\n" << job[r].log;
  const format::RunData rank0 = rank_run(run_dir, 0, world), rank1 = rank_run(run_dir, 1, world);
  const std::vector<std::string> rollbacks = test::event_lines(rank0, format::EventKind::rollback);
  ASSERT_EQ(rollbacks.size(), 1u) << job[0].log;
  EXPECT_EQ(rollbacks[0].rfind("31: to step 29:", 0), 0u) << rollbacks[0];
  EXPECT_EQ(test::event_lines(rank1, format::EventKind::rollback), rollbacks);
  EXPECT_EQ(test::event_lines(rank0, format::EventKind::warning), test::event_lines(rank1, format::EventKind::warning));
  EXPECT_EQ(format::rolled_back_rows(rank0), format::rolled_back_rows(rank1));
  const auto w0 = mlp_weights(dir.file("rank0.h5")), w1 = mlp_weights(dir.file("rank1.h5"));
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_TRUE(at::equal(w0[i].second, w1[i].second)) << w0[i].first;
}

TEST(DataParallel, KilledRankEndsTheJobWithAClearErrorAndNoHang) {
  const int world = 2;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world, mlp_args(run_dir, 1000000, 8) + " --dist-timeout 120");
  // Let it train until rank 1 has flushed some rows.
  ASSERT_GE(wait_for_rows(run_dir, 1, world, 40), 40u) << "the job did not start";
  ASSERT_EQ(kill(job[1].pid, SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.wait(0, 30s)) << "rank 0 hung after rank 1 died";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_TRUE(job.wait(1, 5s));
  EXPECT_EQ(job[0].exit_code, 3) << job[0].log;
  EXPECT_NE(job[0].log.find("rank 0 of 2: step "), std::string::npos) << job[0].log;
  EXPECT_NE(job[0].log.find("another rank died or did not answer"), std::string::npos) << job[0].log;
  EXPECT_LT(seconds, 30.0);

  const format::RunData survivor = rank_run(run_dir, 0, world);
  EXPECT_GE(survivor.rows(), 40u);
  ASSERT_EQ(test::event_lines(survivor, format::EventKind::dist_error).size(), 1u);
  EXPECT_GE(rank_run(run_dir, 1, world).rows(), 40u);  // the killed rank's file too
}

// A kill can land in a checkpoint round after one rank has renamed its new
// checkpoint into place and before another has. Here rank 1 is held in the
// middle of writing its second checkpoint (the slow-write shim holds it
// there and marks the moment) while rank 0 finishes its own and waits for
// rank 1 at the next step; both are killed then, every time, however busy
// the machine. Rank 1 is a round behind rank 0: the ranks agree on the
// newest step both still hold (rank 0's previous checkpoint), and the
// resumed job matches the uninterrupted one bit for bit on every rank.
// Rank 1 is held until the kill, so the job cannot end first: a third round
// (step 300) is enough to resume into, and 400 steps keep it short.
TEST(DataParallel, ResumeAfterAKillMidCheckpointRoundMatchesTheWholeRunOnEveryRank) {
  const int world = 2, steps = 400;
  TempDir dir;
  const std::string every = " --checkpoint-every 100 --dist-timeout 60";
  {
    Job whole(dir, world, mlp_args(dir.file("whole"), steps, 8) + every);
    ASSERT_TRUE(whole.wait_all(180s));
    for (int r = 0; r < world; ++r) ASSERT_EQ(whole[r].exit_code, 0) << "rank " << r << ":\n" << whole[r].log;
  }
  const std::string run_dir = dir.file("killed");
  const std::string behind = rank_checkpoint(run_dir, 1);
  const std::string ahead = rank_checkpoint(run_dir, 0);
  {
    const std::string mark = dir.file("rank-1-mid-write");
    Job job(dir, world, mlp_args(run_dir, steps, 8) + every, free_port(),
            {"", "LD_PRELOAD=" + std::string(test::paths::slow_fwrite) + " NANSCOPE_TEST_WRITING_MARK=" + mark});
    // Rank 0's second round is done once its previous checkpoint is an older step than its newest.
    auto rank0_round_done = [&] {
      try {
        return fs::exists(previous_checkpoint_path(ahead)) &&
               checkpoint_step(previous_checkpoint_path(ahead)) < checkpoint_step(ahead);
      } catch (const std::exception&) {
        return false;  // renamed in as it was read
      }
    };
    const auto bound = std::chrono::steady_clock::now() + 120s;  // only a hang reaches it
    while (!(fs::exists(mark) && rank0_round_done()) && std::chrono::steady_clock::now() < bound)
      std::this_thread::sleep_for(20ms);
    for (int r = 0; r < world; ++r) kill(job[r].pid, SIGKILL);
    ASSERT_TRUE(job.wait_all(10s));
    ASSERT_TRUE(fs::exists(mark)) << "rank 1 was not held in its second checkpoint round within 120 s";
    ASSERT_TRUE(rank0_round_done()) << "rank 0 did not finish its second checkpoint round within 120 s";
  }
  // Rank 1 a round behind: its newest checkpoint never made it into place.
  ASSERT_TRUE(fs::exists(behind + ".part"));
  const int64_t rank1_step = checkpoint_step(behind);
  ASSERT_EQ(checkpoint_step(previous_checkpoint_path(ahead)), rank1_step);
  ASSERT_GT(checkpoint_step(ahead), rank1_step);

  Job resumed(dir, world, "--resume " + run_dir + " --dist-timeout 60");
  ASSERT_TRUE(resumed.wait_all(180s));
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(resumed[r].exit_code, 0) << "rank " << r << ":\n" << resumed[r].log;
    EXPECT_NE(resumed[r].log.find(", from step " + std::to_string(rank1_step) + "\n"), std::string::npos)
        << "rank " << r << " resumed elsewhere:\n"
        << resumed[r].log;
    const format::RunData a = rank_run(dir.file("whole"), r, world), b = rank_run(run_dir, r, world);
    ASSERT_EQ(b.rows(), size_t(steps)) << "rank " << r << ": every step once";
    for (size_t i = 0; i < b.rows(); ++i) {
      ASSERT_EQ(b.step[i], int64_t(i));
      ASSERT_EQ(b.loss[i], a.loss[i]) << "rank " << r << ", step " << i;
    }
    EXPECT_EQ(test::event_lines(b, format::EventKind::resume).size(), 1u);
  }
  const auto w = mlp_weights(rank_checkpoint(dir.file("whole"), 0)), k = mlp_weights(rank_checkpoint(run_dir, 0));
  ASSERT_EQ(w.size(), k.size());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(at::equal(w[i].second, k[i].second)) << w[i].first;
}

// Ranks with no step in common: every rank stops with the same one-line
// error (exit 2), none waits for the others.
TEST(DataParallel, ResumeWhenTheRanksShareNoCheckpointIsAUsageErrorOnEveryRank) {
  const int world = 2;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  {
    Job job(dir, world, mlp_args(run_dir, 20, 8) + " --checkpoint-every 10");
    ASSERT_TRUE(job.wait_all(60s));
    for (int r = 0; r < world; ++r) ASSERT_EQ(job[r].exit_code, 0) << job[r].log;
  }
  fs::remove(rank_checkpoint(run_dir, 1));
  fs::remove(previous_checkpoint_path(rank_checkpoint(run_dir, 1)));
  Job resumed(dir, world, "--resume " + run_dir + " --dist-timeout 30");
  ASSERT_TRUE(resumed.wait_all(60s));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(resumed[r].exit_code, 2) << resumed[r].log;
    EXPECT_NE(resumed[r].log.find("share no step (steps done: rank 0: 20 10; rank 1: none)"), std::string::npos)
        << resumed[r].log;
  }
}

// A rank that stops answering (not dead: its sockets stay open) is caught by
// the collective timeout.
TEST(DataParallel, StalledRankIsCaughtByTheCollectiveTimeout) {
  const int world = 2;
  TempDir dir;
  const std::string run_dir = dir.file("dp");
  Job job(dir, world, mlp_args(run_dir, 1000000, 8) + " --dist-timeout 3");
  ASSERT_GE(wait_for_rows(run_dir, 1, world, 20), 20u) << "the job did not start";
  ASSERT_EQ(kill(job[1].pid, SIGSTOP), 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  const bool ended = job.wait(0, 40s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  kill(job[1].pid, SIGKILL);
  ASSERT_TRUE(ended) << "rank 0 hung past --dist-timeout 3";
  EXPECT_EQ(job[0].exit_code, 3) << job[0].log;
  EXPECT_GE(seconds, 2.5);
  EXPECT_LT(seconds, 40.0);
  EXPECT_GE(rank_run(run_dir, 0, world).rows(), 20u);
}

TEST(DataParallel, MissingPeerFailsTheRendezvousWithinTheTimeout) {
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto result = test::run_command(
      "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) + " timeout 60 " +
      test::paths::train_exe + " " + mlp_args(dir.file("dp"), 5, 8) + " --dist-timeout 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_NE(result.output.find("rendezvous at 127.0.0.1"), std::string::npos) << result.output;
  EXPECT_LT(seconds, 30.0);
}

TEST(DataParallel, BadRankOrFaultRankIsAUsageError) {
  TempDir dir;
  const std::string exe = test::paths::train_exe;
  auto r = test::run_command("RANK=2 WORLD_SIZE=2 " + exe + " " + mlp_args(dir.file("a"), 5, 8));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("outside [0, 2)"), std::string::npos) << r.output;
  r = test::run_command(exe + " --world-size 2 --rank 0 --fault log_nonpositive@2/rank5 " +
                        mlp_args(dir.file("b"), 5, 8));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("only 2 rank(s)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("a"))) << "nothing written for a usage error";
}

}  // namespace
}  // namespace nanscope

namespace nanscope {
namespace {

// scripts/launch.sh: torchrun's environment for N local ranks, and a failed
// rank stops the others instead of leaving them waiting for it.
TEST(Launcher, StartsEveryRankAndStopsTheOthersWhenOneFails) {
  test::TempDir dir;
  const std::string launch = std::string(test::paths::scripts) + "/launch.sh";
  auto ok = test::run_command(launch + " 2 " + test::paths::train_exe +
                              " --model mlp --steps 5 --threads 1 --quiet --run-dir " + dir.file("dp"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("dp/run-rank-0.h5")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("dp/run-rank-1.h5")));

  const auto start = std::chrono::steady_clock::now();
  auto failed = test::run_command(launch + " 3 sh -c 'if [ $RANK = 1 ]; then exit 5; fi; sleep 60'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(failed.exit_code, 5) << failed.output;
  EXPECT_NE(failed.output.find("stopping the others"), std::string::npos) << failed.output;
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(test::run_command(launch + " x").exit_code, 2);
}

}  // namespace
}  // namespace nanscope
