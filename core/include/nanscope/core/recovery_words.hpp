#pragma once
// What a recovery says: its words made from the plan and the values it was
// decided from, in one place. The plan itself (recovery.hpp) holds none.
#include <string>

#include "nanscope/core/recovery.hpp"

namespace nanscope {

struct RecoveryWords {
  // What went wrong, as the action's line names it: the fallback's "X at
  // bf16 -> skipped; fallback ...", the rollback's cause, a skip's "X -> skipped".
  std::string subject;
  // The rest of the line: a skip's reason (", loss scale 512"), a remedy's
  // event text, the stop's whole text; "" where the action says it all.
  std::string why;
  std::string then_stop;  // RecoveryPlan::then_stop: the stop's text
};

RecoveryWords recovery_words(const RecoveryPlan& plan, const StepFacts& facts, const RecoveryState& state);

}  // namespace nanscope
