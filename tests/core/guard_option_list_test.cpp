// The guard's options, declared once: what each surface makes of the one
// list (nanscope-train's flags, Python's keywords, run.h5's config, the check
// of a C++ GuardOptions) must agree with it.
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <set>
#include <stdexcept>

#include "../support/test_support.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/nanscope.hpp"

using namespace nanscope;

namespace {

// The message `set` refuses `text` with, or "" when it takes it.
std::string refusal(const char* name, const std::string& text) {
  GuardOptions scratch;
  try {
    find_guard_option(name)->set(scratch, text);
    return "";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

// Options that differ from the defaults in every field the list declares.
GuardOptions unusual_options() {
  GuardOptions o;
  o.run_dir = "elsewhere";
  o.amp = Amp::fp16;
  o.clip = 0.25;
  o.fallback = FallbackMode::off;
  o.lr_backoff = 0.125;
  o.fp32_modules = {"blocks.0.attn", "head"};
  o.fallback_min_scale = 4;
  o.probe = true;  // as by default: capture and the activation record need it
  o.warn = false;
  o.capture_every_step = true;
  o.act_absmax_every = 7;
  o.max_snapshots = 9;
  o.max_nonfinite_run = 0;
  o.rollback.enabled = false;
  o.rollback.every = 3;
  o.rollback.states = 2;
  o.rollback.memory_mb = 64;
  o.rollback.max_rollbacks = 1;
  o.doom_search.enabled = true;
  o.doom_search.memory_mb = 32;
  return o;
}

}  // namespace

TEST(GuardOptionList, EveryOptionReadsBackTheTextItWrites) {
  for (const GuardOptions& given : {GuardOptions{}, unusual_options()})
    for (const GuardOption& option : guard_option_list()) {
      GuardOptions read;
      option.set(read, option.text(given));
      EXPECT_EQ(option.text(read), option.text(given)) << option.name;
    }
  // Every field the list declares was changed above, so a list entry that
  // wrote to the wrong field would leave the defaults' text behind.
  const auto defaults = recorded_config(GuardOptions{});
  const auto unusual = recorded_config(unusual_options());
  for (const GuardOption& option : guard_option_list())
    if (option.name != "probe") {
      EXPECT_NE(defaults.at(option.name), unusual.at(option.name)) << option.name;
    }
  GuardOptions bare;
  find_guard_option("probe")->set(bare, "off");
  EXPECT_FALSE(bare.probe);
}

TEST(GuardOptionList, EachOptionIsSpelledAsEachSurfaceWritesIt) {
  std::set<std::string> names, fields;
  for (const GuardOption& option : guard_option_list()) {
    EXPECT_TRUE(names.insert(option.name).second) << "declared twice: " << option.name;
    EXPECT_TRUE(fields.insert(option.field).second) << "one field, two options: " << option.field;
    EXPECT_EQ(find_guard_option(option.name), &option);
  }
  const GuardOption& every = *find_guard_option("rollback_every");
  EXPECT_EQ(spelled(every, OptionSpelling::flag), "--rollback-every");
  EXPECT_EQ(spelled(every, OptionSpelling::keyword), "rollback_every");
  EXPECT_EQ(spelled(every, OptionSpelling::field), "GuardOptions::rollback.every");
  EXPECT_EQ(find_guard_option("no_such_option"), nullptr);
  // A help text names another option as its reader writes it.
  const GuardOption& fallback = *find_guard_option("fallback");
  EXPECT_NE(option_help(fallback, OptionSpelling::flag).find("LR x --lr-backoff"), std::string::npos);
  EXPECT_NE(option_help(fallback, OptionSpelling::keyword).find("LR x lr_backoff"), std::string::npos);
  for (const GuardOption& option : guard_option_list())
    EXPECT_EQ(option_help(option, OptionSpelling::keyword).find('{'), std::string::npos) << option.name;
}

TEST(GuardOptionList, ARefusedValueSaysWhatTheOptionTakes) {
  EXPECT_EQ(refusal("rollback_every", "0"), "must be a positive whole number, not '0'");
  EXPECT_EQ(refusal("rollback_every", "2.5"), "must be a positive whole number, not '2.5'");
  EXPECT_EQ(refusal("clip", "nan"), "must be a non-negative finite number, not 'nan'");
  EXPECT_EQ(refusal("lr_backoff", "0"), "must be a number in (0, 1], not '0'");
  EXPECT_EQ(refusal("amp", "fp8"), "must be one of off, bf16, fp16, not 'fp8'");
  EXPECT_EQ(refusal("run_dir", ""), "must not be empty");
  // Words are read whatever their case; the spellings help leaves out are read too.
  EXPECT_EQ(refusal("amp", "BF16"), "");
  EXPECT_EQ(refusal("amp", "torch.bfloat16"), "");
  EXPECT_EQ(refusal("fallback", "on"), "");
  EXPECT_EQ(refusal("lr_backoff", "1"), "");
  EXPECT_EQ(refusal("rollback_every", "+7"), "");
  // What nanscope-train before the option list wrote into options.toml for a word option.
  GuardOptions old;
  find_guard_option("amp")->set(old, "1");
  find_guard_option("fallback")->set(old, "2");
  find_guard_option("rollback")->set(old, "0");
  EXPECT_EQ(old.amp, Amp::bf16);
  EXPECT_EQ(old.fallback, FallbackMode::automatic);
  EXPECT_FALSE(old.rollback.enabled);
}

TEST(GuardOptionList, TheCheckNamesTheOptionAsTheLoopsAuthorSpellsIt) {
  GuardOptions o;
  o.rollback.every = 0;
  try {
    check_guard_options(o, OptionSpelling::field);
    FAIL() << "rollback.every = 0 passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "GuardOptions::rollback.every: must be a positive whole number, not '0'");
  }
  GuardOptions bare;
  bare.probe = false;
  bare.act_absmax_every = 5;
  EXPECT_THROW(check_guard_options(bare, OptionSpelling::keyword), std::invalid_argument);
  try {
    check_guard_options(bare, OptionSpelling::flag);
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--act-absmax-every needs --probe on");
  }
  // Exact: a value just past a bound is not rounded back inside it.
  GuardOptions past;
  past.lr_backoff = 1.0000001;
  EXPECT_THROW(check_guard_options(past, OptionSpelling::field), std::invalid_argument);
  past.lr_backoff = 0.1;
  EXPECT_EQ(find_guard_option("lr_backoff")->text(past), "0.1");
  EXPECT_NO_THROW(check_guard_options(GuardOptions{}, OptionSpelling::field));
  EXPECT_NO_THROW(check_guard_options(unusual_options(), OptionSpelling::field));
}

TEST(GuardOptionList, AGuardBuiltWithAnOptionOutOfRangeRefusesToStartAndWritesNothing) {
  test::TempDir dir;
  torch::nn::Linear model(2, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  GuardOptions o{dir.file("run")};
  o.clip = -1;
  o.log = nullptr;
  try {
    StepGuard guard(*model, optimizer, o);
    FAIL() << "a negative clip was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "GuardOptions::clip: must be a non-negative finite number, not '-1'");
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("run")));
}

TEST(GuardOptionList, TheRunFileRecordsEveryOptionBesideTheLoopsOwnConfig) {
  GuardOptions o = unusual_options();
  o.config = {{"model", "mine"}, {"clip", "what the loop thought"}};
  const auto config = recorded_config(o);
  EXPECT_EQ(config.at("model"), "mine");
  EXPECT_EQ(config.at("clip"), "0.25") << "the guard's own value wins";
  EXPECT_EQ(config.at("fp32_modules"), "blocks.0.attn,head");
  EXPECT_EQ(config.at("capture"), "every-step");
  EXPECT_EQ(config.at("rollback"), "off");
  EXPECT_EQ(config.size(), guard_option_list().size() + 1);
}
