#pragma once
// A rank's recovery plan and the facts its words are made from, as values
// that cross ranks: every rank carries out the strongest plan and words it
// itself, once (recovery_words), from the plan and the facts of the rank
// that made it. Numbers go in one sum (a row per rank), texts from the
// chosen rank in one broadcast. Private to the guard's files.
#include <string>

#include "nanscope/core/recovery.hpp"

namespace nanscope {

struct PlanValues {
  RecoveryPlan plan;
  StepFacts facts;  // what recovery_words reads of them
};

// A rank's row of numbers: plan_strength first, then the plan's and its
// facts' numbers, and the length of texts_of(...).
inline constexpr int kPlanNumbers = 18;
void write_plan_numbers(const PlanValues& values, size_t texts_length, double* row);
size_t texts_length_of(const double* row);

// The plan's and its facts' texts (each field with its length before it).
std::string plan_texts(const PlanValues& values);

// The values again, from a row of numbers and the same rank's texts. The
// diagnosis keeps what the words need (no cause, no trigger samples).
PlanValues plan_values_from(const double* row, const std::string& texts);

}  // namespace nanscope
