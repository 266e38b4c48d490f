// --fault's spelling and what the loop plants from it.
#include <gtest/gtest.h>

#include "nanscope/models/fault.hpp"

using namespace nanscope;

TEST(FaultSpec, ParsesKindStepAndArgument) {
  Fault f = parse_fault("nonfinite_input@12:3");
  EXPECT_EQ(f.kind, FaultKind::nonfinite_input);
  EXPECT_EQ(f.step, 12);
  EXPECT_EQ(f.arg, 3);
  EXPECT_EQ(parse_fault("lr_spike@2").arg, 1000.0);
  EXPECT_THROW(parse_fault("log_nonpositive"), std::invalid_argument);
  EXPECT_THROW(parse_fault("bogus@1"), std::invalid_argument);
  EXPECT_THROW(parse_fault("exp_overflow@x"), std::invalid_argument);
  std::vector<Fault> plan{parse_fault("lr_spike@5:10"), parse_fault("exp_overflow@7")};
  EXPECT_EQ(lr_multiplier_at(plan, 4), 1.0);
  EXPECT_EQ(lr_multiplier_at(plan, 9), 10.0);
  EXPECT_EQ(model_fault_at(plan, 7).kind, FaultKind::exp_overflow);
  EXPECT_EQ(model_fault_at(plan, 5).kind, FaultKind::none);
}
