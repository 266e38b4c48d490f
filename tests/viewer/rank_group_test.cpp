// A multi-process run in the viewer's model: every rank's file opens as its
// own run, the ranks form one group in rank order, and the group knows which
// rank went non-finite first (or says it does not know).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../support/test_support.hpp"
#include "nanscope/viewer/rank_group.hpp"
#include "nanscope/viewer/view_model.hpp"
#include "synthetic_files.hpp"

using namespace nanscope;
using viewer::ViewModel;

namespace {

using Ranks = std::vector<int>;

std::vector<int> ranks_of(const ViewModel& model, const viewer::RankGroup& group) {
  std::vector<int> ranks;
  for (size_t run : group.runs) ranks.push_back(model.runs[run].rank());
  return ranks;
}

}  // namespace

TEST(FirstNonfiniteRanks, TheEarliestEventThatParsesWins) {
  const std::vector<format::RunEvent> events = {{10, format::EventKind::nonfinite_ranks, "3"},
                                                {50, format::EventKind::first_nonfinite, "0"},
                                                {40, format::EventKind::first_nonfinite, "garbage"},
                                                {45, format::EventKind::first_nonfinite, "2,1"},
                                                {60, format::EventKind::first_nonfinite, "3"}};
  const viewer::FirstNonfiniteRanks first = viewer::first_nonfinite_ranks(events, 4);
  ASSERT_TRUE(first.known());
  EXPECT_EQ(first.step, 45);
  EXPECT_EQ(first.ranks, (Ranks{1, 2}));
  EXPECT_TRUE(first.has(2));
  EXPECT_FALSE(first.has(0));
  EXPECT_FALSE(viewer::first_nonfinite_ranks({{10, format::EventKind::nonfinite_ranks, "3"}}, 4).known());
}

TEST(ViewModel, OpensEveryRankOfAMultiProcessRunAsOneGroup) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  test::write_synthetic_rank_dir(run_dir, 4, 100, 6, /*nan_rank=*/1, /*nan_step=*/40, "1");
  ViewModel model;
  ASSERT_TRUE(model.open({run_dir}));
  EXPECT_TRUE(model.errors().empty());
  ASSERT_EQ(model.runs.size(), 4u);
  ASSERT_EQ(model.groups.size(), 1u);
  const viewer::RankGroup& group = model.groups[0];
  EXPECT_EQ(group.label, "run");
  EXPECT_EQ(group.world_size, 4);
  EXPECT_EQ(ranks_of(model, group), (Ranks{0, 1, 2, 3}));
  for (int rank = 0; rank < 4; ++rank) {
    const viewer::RunSource& run = model.runs[group.runs[size_t(rank)]];
    EXPECT_EQ(run.label(), "run rank " + std::to_string(rank));
    EXPECT_EQ(model.group_of(group.runs[size_t(rank)]), &group);
    EXPECT_EQ(run.data().rows(), 100u);
    // Only rank 1's own layer norms are NaN at step 40; every rank skipped it.
    EXPECT_EQ(std::isnan(run.grad_norms().max_over(3, 40, 41, 1)), rank == 1) << rank;
    EXPECT_EQ(run.first_nonfinite_step(), 40) << rank;
  }
  ASSERT_TRUE(group.first_nonfinite.known());
  EXPECT_EQ(group.first_nonfinite.step, 40);
  EXPECT_EQ(group.first_nonfinite.ranks, Ranks{1});
  EXPECT_EQ(model.runs[model.first_run_to_show()].rank(), 1) << "the window opens on the first non-finite rank";

  ASSERT_EQ(model.snapshots.size(), 1u);
  const viewer::SnapshotEntry& snapshot = model.snapshots[0];
  EXPECT_EQ(std::filesystem::path(snapshot.path).parent_path(),
            std::filesystem::path(run_dir) / "snapshots" / "rank-1");
  ASSERT_GE(snapshot.run, 0);
  EXPECT_EQ(model.runs[size_t(snapshot.run)].rank(), 1) << "the snapshot belongs to the rank that wrote it";
  ASSERT_TRUE(snapshot.summary);
  EXPECT_EQ(snapshot.summary->step, 40);
}

TEST(ViewModel, OneProcessRunIsNotAGroup) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "run");
  test::write_synthetic_run(dir.file("run/run.h5"), 50, 3, 20);
  ViewModel model;
  ASSERT_TRUE(model.open({dir.file("run")}));
  ASSERT_EQ(model.runs.size(), 1u);
  EXPECT_TRUE(model.groups.empty());
  EXPECT_EQ(model.group_of(0), nullptr);
  EXPECT_EQ(model.runs[0].rank(), -1);
  EXPECT_EQ(model.runs[0].label(), "run");
  EXPECT_EQ(model.first_run_to_show(), 0u);
}

TEST(ViewModel, GarbledOrMissingFirstNonfiniteRanksIsUnknown) {
  test::TempDir dir;
  test::write_synthetic_rank_dir(dir.file("garbled"), 2, 60, 4, 1, 30, "rank one?!");
  test::write_synthetic_rank_dir(dir.file("out-of-range"), 2, 60, 4, 1, 30, "1,7");
  test::write_synthetic_rank_dir(dir.file("missing"), 2, 60, 4, 1, 30, "");
  ViewModel model;
  ASSERT_NO_THROW(EXPECT_TRUE(model.open({dir.file("garbled"), dir.file("out-of-range"), dir.file("missing")})));
  EXPECT_TRUE(model.errors().empty());
  ASSERT_EQ(model.groups.size(), 3u);
  for (const viewer::RankGroup& group : model.groups) {
    EXPECT_EQ(ranks_of(model, group), (Ranks{0, 1})) << group.label;
    EXPECT_FALSE(group.first_nonfinite.known()) << group.label;
    EXPECT_TRUE(group.first_nonfinite.ranks.empty()) << group.label;
  }
  EXPECT_FALSE(model.poll());
}

TEST(ViewModel, BadRankFileIsAnErrorAndTheOtherRanksStillOpen) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  test::write_synthetic_rank_dir(run_dir, 3, 60, 4, 2, 30, "2");
  std::ofstream(run_dir + "/run-rank-1.h5", std::ios::trunc) << "not HDF5";
  ViewModel model;
  EXPECT_FALSE(model.open({run_dir}));
  ASSERT_EQ(model.errors().size(), 1u);
  EXPECT_NE(model.errors()[0].find("run-rank-1.h5"), std::string::npos) << model.errors()[0];
  ASSERT_EQ(model.groups.size(), 1u);
  EXPECT_EQ(ranks_of(model, model.groups[0]), (Ranks{0, 2}));
  EXPECT_EQ(model.groups[0].world_size, 3);
  EXPECT_EQ(model.groups[0].first_nonfinite.ranks, Ranks{2});
  model.poll();  // the bad file is retried quietly, not reported every poll
  EXPECT_EQ(model.errors().size(), 1u);
}

// Rank 0 is live when the viewer opens; rank 1 starts late and goes
// non-finite first: polling picks up rank 0's new rows, rank 1's file, its
// snapshot folder and the group's first non-finite rank.
TEST(ViewModel, FollowsLiveRanksAndARankThatStartsLate) {
  test::TempDir dir;
  const std::string run_dir = dir.file("run");
  std::filesystem::create_directories(run_dir);
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  if (child == 0) {
    format::RunHeader header = test::synthetic_header(4);
    header.config["rank"] = "0";
    header.config["world_size"] = "2";
    format::RunWriter writer(run_dir + "/" + format::run_file_name(0, 2), header, /*flush_every=*/8);
    for (int64_t s = 0; s < 16; ++s) writer.append(test::synthetic_row(s, 4));
    char c = 'x';
    (void)!write(to_parent[1], &c, 1);
    (void)!read(to_child[0], &c, 1);
    for (int64_t s = 16; s < 40; ++s) writer.append(test::synthetic_row(s, 4));
    writer.event(30, format::EventKind::nonfinite_ranks, "1");
    writer.event(30, format::EventKind::first_nonfinite, "1");
    writer.flush();
    test::write_synthetic_rank_run(run_dir + "/" + format::run_file_name(1, 2), 1, 2, 40, 4, 1, 30, "1");
    const std::string snapshot = test::rank_snapshot_path(run_dir, 1, 2, 30);
    std::filesystem::create_directories(std::filesystem::path(snapshot).parent_path());
    test::write_synthetic_snapshot(snapshot, 30, 4, false);
    (void)!write(to_parent[1], &c, 1);
    std::this_thread::sleep_for(std::chrono::seconds(30));  // killed by the parent
    _exit(0);
  }
  char c = 'x';
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  ViewModel model;
  ASSERT_TRUE(model.open({run_dir}));
  ASSERT_EQ(model.groups.size(), 1u);
  EXPECT_EQ(ranks_of(model, model.groups[0]), Ranks{0});
  EXPECT_EQ(model.groups[0].world_size, 2) << "from rank 0's config, before rank 1 exists";
  EXPECT_FALSE(model.groups[0].first_nonfinite.known());
  EXPECT_FALSE(model.poll());
  ASSERT_EQ(write(to_child[1], &c, 1), 1);
  ASSERT_EQ(read(to_parent[0], &c, 1), 1);
  EXPECT_TRUE(model.poll());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  const viewer::RankGroup& group = model.groups[0];
  ASSERT_EQ(ranks_of(model, group), (Ranks{0, 1}));
  EXPECT_EQ(model.runs[group.runs[0]].data().rows(), 40u);
  EXPECT_EQ(model.runs[group.runs[0]].rows_since_open(), 24u);
  EXPECT_EQ(model.runs[group.runs[1]].label(), "run rank 1");
  EXPECT_EQ(model.group_of(group.runs[1]), &group);
  ASSERT_TRUE(group.first_nonfinite.known());
  EXPECT_EQ(group.first_nonfinite.step, 30);
  EXPECT_EQ(group.first_nonfinite.ranks, Ranks{1});
  ASSERT_EQ(model.snapshots.size(), 1u);
  EXPECT_EQ(model.snapshots[0].run, int(group.runs[1]));
  EXPECT_FALSE(model.poll()) << "nothing new";
}
