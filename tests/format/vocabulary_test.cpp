// Every word of every list survives to_string and from_string, spellings are
// unique, and a word a reader does not know is `unknown`, not an error.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "nanscope/format/vocabulary.hpp"

using namespace nanscope::format;

namespace {

template <typename Word>
void expect_round_trip() {
  std::set<std::string> seen;
  for (size_t i = 0; i < Words<Word>::count; ++i) {
    const Word word = static_cast<Word>(i);
    const std::string spelling = to_string(word);
    EXPECT_TRUE(seen.insert(spelling).second) << "spelled twice: " << spelling;
    const std::optional<Word> back = from_string<Word>(spelling);
    ASSERT_TRUE(back) << spelling;
    EXPECT_EQ(*back, word) << spelling;
  }
  EXPECT_EQ(static_cast<size_t>(Word::unknown), Words<Word>::count) << "unknown comes after the last word";
  EXPECT_STREQ(to_string(Word::unknown), "unknown");
  EXPECT_FALSE(from_string<Word>("no-such-word"));
  EXPECT_EQ(from_string_or_unknown<Word>("no-such-word"), Word::unknown);
}

}  // namespace

TEST(Vocabulary, EveryWordOfEveryListRoundTrips) {
  expect_round_trip<EventKind>();
  expect_round_trip<Phase>();
  expect_round_trip<BirthKind>();
  expect_round_trip<Precision>();
  expect_round_trip<Verdict>();
  expect_round_trip<Category>();
}

TEST(Vocabulary, TheListsHoldWhatFilesSpell) {
  // The spellings are the file format (docs/format.md): these must not change.
  EXPECT_EQ(Words<EventKind>::count, 18u);
  EXPECT_STREQ(to_string(EventKind::save_refused), "save_refused");
  EXPECT_STREQ(to_string(EventKind::doom), "doom");
  EXPECT_STREQ(to_string(EventKind::empty_loss), "empty_loss");
  EXPECT_STREQ(to_string(Verdict::compiler), "compiler");
  EXPECT_STREQ(to_string(Category::compiled_program), "compiled_program");
  EXPECT_STREQ(to_string(Phase::grad_norm), "grad_norm");
  EXPECT_EQ(static_cast<int>(Precision::fp32), 0);  // /steps/amp's numbers
  EXPECT_EQ(static_cast<int>(Precision::bf16), 1);
  EXPECT_EQ(static_cast<int>(Precision::fp16), 2);
  EXPECT_STREQ(to_string(Category::all_targets_ignored), "all_targets_ignored");
  EXPECT_STREQ(to_string(Category::nonfinite_weights), "nonfinite_weights");
  EXPECT_EQ(from_string<Category>("nonfinite_weights"), Category::nonfinite_weights);
}

TEST(Vocabulary, LargestFiniteValuesAreTheFormats) {
  EXPECT_EQ(largest_finite(Precision::fp16), 65504.0);
  EXPECT_EQ(largest_finite(Precision::fp32), double(3.4028234663852886e38));
  EXPECT_LT(largest_finite(Precision::bf16), largest_finite(Precision::fp32));
  EXPECT_GT(largest_finite(Precision::bf16), 3.38e38);
}
