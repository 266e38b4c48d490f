// Checkpoints: a model's state comes back whole, and a file of another model is refused by name.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/test_support.hpp"
#include "../support/tiny_models.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/models/gpt.hpp"

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

namespace checkpoint_test {

// Each field a value unlike its initial one: the precision, a flag, numbers, a list of names.
void changed(const char*, Amp& amp) { amp = Amp::bf16; }
void changed(const char*, bool& on) { on = !on; }
void changed(const char* name, int64_t& v) { v = 1000 + int64_t(std::string(name).size()); }
void changed(const char* name, double& v) { v = 0.25 + double(std::string(name).size()); }
void changed(const char*, std::vector<std::string>& names) { names = {"blocks.0.mlp", "head"}; }

TEST(Checkpoint, EveryFieldOfTheGuardsStateComesBack) {
  test::TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  auto model = test::tiny_mlp(1);
  ResumeState saved;
  saved.cpu_rng = at::detail::getDefaultCPUGenerator().get_state();
  size_t fields = 0;
  for_each_guard_state_field(saved.guard, [&](const char* name, auto& field) {
    changed(name, field);
    ++fields;
  });
  EXPECT_GE(fields, 10u);
  save_checkpoint(path, *model, 7, &saved);
  const std::optional<ResumeState> loaded = load_resume_state(path);
  ASSERT_TRUE(loaded);
  GuardState expected = saved.guard;
  const GuardState& got = loaded->guard;
  // Field by field, through the same list: a field the file loses shows by name.
  std::string differ;
  for_each_guard_state_field(expected, [&](const char* name, const auto& field) {
    bool same = true;
    for_each_guard_state_field(got, [&](const char* other, const auto& value) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::decay_t<decltype(value)>>)
        if (std::string(other) == name) same = field == value;
    });
    if (!same) differ += std::string(differ.empty() ? "" : ", ") + name;
  });
  EXPECT_EQ(differ, "") << "fields a checkpoint does not give back";
}

}  // namespace checkpoint_test
