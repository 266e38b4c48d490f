// The run's poison list (poison_list.hpp): lines written are read back, a
// person's edits (a line deleted, a note added) are honoured, a line edited
// wrong is an error naming the file and the line, and the two-step rule says
// which epoch leaves a sample out.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "../support/test_support.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/poison_list.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

PoisonedSample sample(int64_t row, int64_t step, const std::string& why = "the batch holds a non-finite value") {
  PoisonedSample s;
  s.row = row;
  s.step = step;
  s.rank = 1;
  s.birth = "nan at input (input) in module '', batch row 3";
  s.why = why;
  return s;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(PoisonList, WrittenLinesReadBackAndAMissingFileIsAnEmptyList) {
  TempDir dir;
  const std::string path = poison_list_path(dir.path().string());
  EXPECT_TRUE(read_poison_list(path).empty());
  append_poisoned_sample(path, sample(363, 40, "quotes \" and \\ and a\ttab"));
  append_poisoned_sample(path, sample(9, 41));
  const std::vector<PoisonedSample> list = read_poison_list(path);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].row, 363);
  EXPECT_EQ(list[0].step, 40);
  EXPECT_EQ(list[0].rank, 1);
  EXPECT_EQ(list[0].why, "quotes \" and \\ and a\ttab");
  EXPECT_EQ(list[0].birth, "nan at input (input) in module '', batch row 3");
  EXPECT_EQ(list[1].row, 9);
  // One JSON object per line: what jq or Python's json reads line by line.
  const std::string text = text_of(path);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2);
  EXPECT_EQ(text.rfind("{\"row\": 363, \"step\": 40, \"rank\": 1, ", 0), 0u) << text;
}

TEST(PoisonList, APersonsEditsAreHonouredAndAWrongLineIsNamed) {
  TempDir dir;
  const std::string path = poison_list_path(dir.path().string());
  {
    std::ofstream out(path);
    out << "{\"row\": 7, \"step\": 3, \"note\": \"checked by hand\", \"ok\": true, \"w\": -1.5e3}\n\n"
        << "  {\"step\": 5, \"row\": 8}  \n";
  }
  const std::vector<PoisonedSample> list = read_poison_list(path);
  ASSERT_EQ(list.size(), 2u) << "a blank line is nothing; unknown keys are kept out of the way";
  EXPECT_EQ(list[0].row, 7);
  EXPECT_EQ(list[1].row, 8);
  EXPECT_EQ(list[1].rank, -1);
  for (const char* bad : {"{\"row\": 7}", "{\"row\": \"seven\", \"step\": 1}", "{\"row\": -3, \"step\": 1}",
                          "row 7 step 3", "{\"row\": 7, \"step\": 3} trailing"}) {
    { std::ofstream(path, std::ios::app) << bad << "\n"; }
    try {
      read_poison_list(path);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line 4"), std::string::npos) << e.what();
    }
    std::ofstream(path) << "{\"row\": 7, \"step\": 3}\n\n{\"step\": 5, \"row\": 8}\n";
  }
}

TEST(PoisonList, AnEpochLeavesOutWhatWasListedTwoStepsBeforeItStarts) {
  const std::vector<PoisonedSample> list = {sample(5, 10), sample(2, 11), sample(5, 30), sample(9, 12)};
  EXPECT_TRUE(rows_left_out_at(list, 11).empty());
  EXPECT_EQ(rows_left_out_at(list, 12), (std::vector<int64_t>{5}));
  EXPECT_EQ(rows_left_out_at(list, 14), (std::vector<int64_t>{2, 5, 9})) << "ascending, each once";
}

TEST(PoisonList, ANewRunKeepsAListItFindsFromItsFirstStep) {
  TempDir dir;
  const std::string path = poison_list_path(dir.path().string());
  EXPECT_EQ(start_poison_list_anew(path), 0u);
  append_poisoned_sample(path, sample(4, 500));
  append_poisoned_sample(path, sample(6, 900));
  EXPECT_EQ(start_poison_list_anew(path), 2u);
  const std::vector<PoisonedSample> list = read_poison_list(path);
  ASSERT_EQ(list.size(), 2u);
  for (const PoisonedSample& s : list) EXPECT_EQ(s.step, kListedBeforeTheRun);
  EXPECT_EQ(list[1].why, "the batch holds a non-finite value");
  EXPECT_EQ(rows_left_out_at(list, 0), (std::vector<int64_t>{4, 6}));
}
