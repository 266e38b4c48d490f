// The warning and rollback texts: what the trainer writes, the viewer and
// scripts read back.
#include <gtest/gtest.h>

#include "nanscope/format/event_text.hpp"
#include "nanscope/format/vocabulary.hpp"

using namespace nanscope::format;

TEST(EventText, AWarningNamesItsLayerAndReadsBack) {
  const std::string text = warning_text({"layer_grad_norm", "blocks.0.mlp", 41.2, 1.3, {}});
  EXPECT_EQ(text, "layer_grad_norm in 'blocks.0.mlp': 41.2 against 1.3");
  EXPECT_EQ(warning_where(text), "blocks.0.mlp");
  EXPECT_EQ(warning_where(warning_text({"activation_headroom", "inputs", 3e18, 1e17, 12.0})), "inputs");
  EXPECT_EQ(warning_where(warning_text({"loss_spike", "", 50, 2, {}})), "");
  EXPECT_EQ(warning_where("loss_spike: 50 against 2 in 'nowhere': x"), "") << "a name after the colon is no layer";
  EXPECT_EQ(warning_where("garbled in 'half"), "");
}

TEST(EventText, ARollbackSaysWhereToAndReadsBack) {
  const std::string text = rollback_text({120, 131, 0.5, 1.5e-4, "the weights are non-finite"});
  EXPECT_EQ(text.rfind("to step 120: steps 121-131 do not count", 0), 0u) << text;
  EXPECT_NE(text.find("LR x 0.5 -> 0.00015"), std::string::npos) << text;
  EXPECT_EQ(rollback_target(text), 120);
  EXPECT_EQ(rollback_target("to step : x"), std::nullopt);
  EXPECT_EQ(rollback_target("to step 12"), std::nullopt) << "no colon: not ours";
  EXPECT_EQ(rollback_target("went back"), std::nullopt);
  EXPECT_EQ(rollback_target("to step 99999999999999999999999: x"), std::nullopt) << "too long is garbled";
}

TEST(EventText, RolledBackRowsAreTheOnesAfterTheTargetUpToTheRollback) {
  RunData run;
  for (int64_t s = 0; s < 10; ++s) run.step.push_back(s);
  run.events.push_back({6, EventKind::rollback, rollback_text({3, 6, 0.5, 1e-3, ""})});
  run.events.push_back({8, EventKind::rollback, "garbled"});  // ignored, not guessed
  EXPECT_EQ(rolled_back_rows(run), (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 0, 0, 0}));
}
