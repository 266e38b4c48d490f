// The rank lists of multi-process run files: written by the trainer, read by the viewer.
#include <gtest/gtest.h>

#include <vector>

#include "nanscope/format/run_file.hpp"

using namespace nanscope;
using Ranks = std::vector<int>;

TEST(RankList, ParsesCommaSeparatedRanksAscendingAndUnique) {
  EXPECT_EQ(format::parse_rank_list("1", 2), Ranks{1});
  EXPECT_EQ(format::parse_rank_list("0,2", 4), (Ranks{0, 2}));
  EXPECT_EQ(format::parse_rank_list(" 3 , 0\t", 4), (Ranks{0, 3}));
  EXPECT_EQ(format::parse_rank_list("1,1", 2), Ranks{1});
  EXPECT_EQ(format::parse_rank_list(format::rank_list_text({0, 2}), 4), (Ranks{0, 2})) << "what the trainer writes";
  EXPECT_EQ(format::parse_rank_list("17", 0), Ranks{17}) << "world size 0: not known, any rank";
}

TEST(RankList, GarbledListsAreUnknownNotGuessed) {
  for (const char* text : {"", " ", ",", "1,", ",1", "1,,2", "one", "1;2", "1 2", "-1", "+1", "1.5", "0x1",
                           "99999999999999999999", "2147483648", "rank 1"})
    EXPECT_FALSE(format::parse_rank_list(text, 0)) << "'" << text << "'";
  EXPECT_FALSE(format::parse_rank_list("2", 2)) << "rank 2 of a 2-process run";
  EXPECT_FALSE(format::parse_rank_list("0,5", 4));
}
