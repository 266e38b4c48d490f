// Checkpoints: a model's state comes back whole, and a file of another model is refused by name.
#include <gtest/gtest.h>

#include "../support/test_support.hpp"
#include "../support/tiny_models.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/models/gpt.hpp"
#include "nanscope/format/error.hpp"

using namespace nanscope;

TEST(Checkpoint, RoundTripsIntoAFreshModel) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  auto trained = test::tiny_mlp(1);
  save_checkpoint(path, *trained, 42);
  auto fresh = test::tiny_mlp(2);
  EXPECT_EQ(load_checkpoint(path, *fresh), 42);
  auto a = trained->named_parameters(), b = fresh->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(Checkpoint, RejectsAnotherModelsCheckpointByName) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  save_checkpoint(path, *test::tiny_mlp(), 1);
  auto gpt = make_gpt(GptConfig{}, 0);
  try {
    load_checkpoint(path, *gpt);
    FAIL();
  } catch (const format::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a 'mlp' model, not 'gpt'"), std::string::npos);
  }
  MlpConfig wider;
  wider.in_features = 8;
  wider.hidden = 32;
  wider.classes = 4;
  auto other = make_mlp(wider, 0);
  EXPECT_THROW(load_checkpoint(path, *other), format::FormatError);
}
