// The compiled-region search on scripted answers: which modules, compiled
// alone, make the step non-finite. No compiler involved: the decision only.
#include <gtest/gtest.h>

#include <set>

#include "nanscope/core/compiled_region.hpp"
#include "nanscope/core/remedy.hpp"

using namespace nanscope;

namespace {

const std::vector<std::string> kPaths = {
    "",         "embed",         "blocks",       "blocks.0",         "blocks.0.attn", "blocks.0.mlp",
    "blocks.1", "blocks.1.attn", "blocks.1.mlp", "blocks.1.mlp.act", "head"};

struct Oracle {
  std::set<std::string> breaking;  // the modules that, compiled alone, break the step
  std::vector<std::string> asked;
  bool operator()(const std::string& path) {
    asked.push_back(path);
    return breaking.count(path) > 0;
  }
};

CompiledRegion search(Oracle& oracle, int max_runs = 48) {
  return locate_compiled_region(kPaths, std::ref(oracle), max_runs);
}

}  // namespace

TEST(CompiledRegion, DescendsToTheSmallestModuleThatBreaksTheStepCompiledAlone) {
  // The wrong kernel is the activation's: every module holding it breaks the step.
  Oracle oracle{{"blocks", "blocks.1", "blocks.1.mlp", "blocks.1.mlp.act"}, {}};
  const CompiledRegion r = search(oracle);
  EXPECT_EQ(r.module, "blocks.1.mlp.act");
  EXPECT_FALSE(r.budget_spent);
  // Children in their order, one level at a time; never a module outside the path.
  EXPECT_EQ(oracle.asked, (std::vector<std::string>{"embed", "blocks", "blocks.0", "blocks.1", "blocks.1.attn",
                                                    "blocks.1.mlp", "blocks.1.mlp.act"}));
  EXPECT_EQ(r.runs, int(oracle.asked.size()));
}

TEST(CompiledRegion, AFaultThatNeedsModulesFusedTogetherIsTheirParentsOrTheWholeModels) {
  Oracle fused_in_block{{"blocks", "blocks.0"}, {}};  // blocks.0 breaks, neither of its children alone
  EXPECT_EQ(search(fused_in_block).module, "blocks.0");
  Oracle whole{{}, {}};  // no child alone: the whole model's compiled graph
  const CompiledRegion r = search(whole);
  EXPECT_EQ(r.module, "");
  EXPECT_EQ(r.runs, 3);  // embed, blocks, head
}

TEST(CompiledRegion, StopsAtItsBudgetWithTheRegionSoFar) {
  Oracle oracle{{"blocks", "blocks.1", "blocks.1.mlp", "blocks.1.mlp.act"}, {}};
  const CompiledRegion r = search(oracle, 3);
  EXPECT_TRUE(r.budget_spent);
  EXPECT_EQ(r.module, "blocks");
  EXPECT_EQ(r.runs, 3);
}

TEST(CompiledRegion, TheCompilersStepIsSkippedAndNeverCalledTransient) {
  // The forensic re-run (eager) was finite with no birth; compiled, it was non-finite.
  format::Capture capture;
  capture.ops_seen = 120;
  capture.compiled_only = true;
  capture.compiled_region = "blocks.1.mlp";
  FailedStep failed;
  failed.capture = capture;
  struct NoReruns : StepReruns {
    bool finite(Amp, const std::vector<std::string>&, int64_t) override {
      ADD_FAILURE() << "the compiler's step needs no re-run to choose its remedy";
      return true;
    }
    std::vector<std::string> modules_seen() override { return {}; }
    bool unswitchable() const override { return false; }
  } reruns;
  const RemedyChoice choice = choose_remedy(failed, reruns);
  EXPECT_EQ(choice.remedy, Remedy::skip_compiler);
  EXPECT_NE(choice.why.find("module 'blocks.1.mlp' compiled alone breaks the step"), std::string::npos) << choice.why;
  EXPECT_EQ(format::capture_text(capture), choice.why);
}
