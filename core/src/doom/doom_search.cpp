#include "nanscope/core/doom_search.hpp"

#include "nanscope/common/json_text.hpp"

namespace nanscope {

namespace {

// Thrown by a replay the budget has no room for; find_dooming_step reports
// the range it had narrowed the cause to.
struct BudgetSpent {};

bool replay(EarlierSteps& steps, const LeaveOut& leave_out, int& replays) {
  if (!steps.budget_left()) throw BudgetSpent{};
  ++replays;
  return steps.survives(leave_out);
}

// The rows of `step` without which the run survives: halves while one half
// alone does it, else the set where neither half did (several rows together).
std::vector<int64_t> dooming_rows(EarlierSteps& steps, int64_t step, int64_t rows, int& replays) {
  std::vector<int64_t> candidates;
  for (int64_t r = 0; r < rows; ++r) candidates.push_back(r);
  while (candidates.size() > 1) {
    const auto half = candidates.begin() + std::ptrdiff_t(candidates.size() / 2);
    const std::vector<int64_t> left(candidates.begin(), half), right(half, candidates.end());
    if (replay(steps, {step, step, left}, replays)) {
      candidates = left;
      continue;
    }
    if (replay(steps, {step, step, right}, replays)) {
      candidates = right;
      continue;
    }
    break;
  }
  // Every row together is the whole update: no row alone did it (an LR spike).
  if (candidates.size() == size_t(rows)) return {};
  return candidates;
}

}  // namespace

DoomFinding find_dooming_step(EarlierSteps& steps) {
  DoomFinding finding;
  const std::vector<int64_t> applied = steps.applied_steps();
  if (applied.empty()) return finding;
  // Invariant, once the first replay survived: leaving out the updates of applied[lo..hi] saves the run.
  size_t lo = 0, hi = applied.size() - 1;
  try {
    if (!replay(steps, {applied.front(), applied.back(), {}}, finding.replays)) return finding;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (replay(steps, {applied[lo], applied[mid], {}}, finding.replays)) {
        hi = mid;
        continue;
      }
      if (replay(steps, {applied[mid + 1], applied[hi], {}}, finding.replays)) {
        lo = mid + 1;
        continue;
      }
      finding.outcome = DoomOutcome::several_steps;
      finding.first = applied[lo];
      finding.last = applied[hi];
      return finding;
    }
    finding.outcome = DoomOutcome::dooming_step;
    finding.step = finding.first = finding.last = applied[lo];
    if (const int64_t rows = steps.searchable_rows(finding.step); rows > 1)
      finding.rows = dooming_rows(steps, finding.step, rows, finding.replays);
  } catch (const BudgetSpent&) {
    // Found the step but not yet its rows: the step stands, its whole update.
    if (finding.outcome == DoomOutcome::dooming_step) return finding;
    finding.outcome = DoomOutcome::budget_spent;
    finding.first = applied[lo];
    finding.last = applied[hi];
  }
  return finding;
}

std::string doom_text(const DoomFinding& finding) {
  switch (finding.outcome) {
    case DoomOutcome::dooming_step: {
      std::string text = "step " + std::to_string(finding.step);
      if (!finding.rows.empty()) text += finding.rows.size() == 1 ? ", batch row " : ", batch rows ";
      for (size_t i = 0; i < finding.rows.size(); ++i) text += (i ? ", " : "") + std::to_string(finding.rows[i]);
      return text;
    }
    case DoomOutcome::several_steps:
      return "steps " + std::to_string(finding.first) + "-" + std::to_string(finding.last);
    case DoomOutcome::budget_spent:
      return "not found within the step budget (steps " + std::to_string(finding.first) + "-" +
             std::to_string(finding.last) + " still suspected)";
    case DoomOutcome::no_earlier_step:
    case DoomOutcome::unknown: break;
  }
  return "no earlier step";
}

std::string doom_sentence(const DoomFinding& f, int64_t failing, const std::string& rows_text) {
  const std::string k = std::to_string(failing);
  switch (f.outcome) {
    case DoomOutcome::dooming_step:
      return "step " + std::to_string(f.step) + " doomed step " + k + ": without " + rows_text + " the steps up to " +
             k + " stay finite";
    case DoomOutcome::several_steps:
      return "no single step doomed step " + k + ": finite without steps " + std::to_string(f.first) + "-" +
             std::to_string(f.last) + " together, not one";
    case DoomOutcome::no_earlier_step:
      return "no earlier step doomed step " + k + ": non-finite with every update since the saved state left out";
    case DoomOutcome::budget_spent:
    case DoomOutcome::unknown: break;
  }
  return doom_text(f);
}

std::string doom_json(const DoomFinding& f, int64_t failing, int64_t steps_run, const std::string& sentence) {
  const std::string rows = list_json(f.rows, [](int64_t row) { return std::to_string(row); });
  return "{ \"outcome\": " + json_quoted(to_string(f.outcome)) + ", \"failing_step\": " + std::to_string(failing) +
         ", \"step\": " + (f.outcome == DoomOutcome::dooming_step ? std::to_string(f.step) : "null") +
         ", \"rows\": " + rows + ", \"first\": " + std::to_string(f.first) + ", \"last\": " + std::to_string(f.last) +
         ", \"replays\": " + std::to_string(f.replays) + ", \"steps_run\": " + std::to_string(steps_run) +
         ", \"text\": " + json_quoted(sentence) + " }";
}

}  // namespace nanscope
