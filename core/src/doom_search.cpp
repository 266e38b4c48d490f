#include "nanscope/core/doom_search.hpp"

namespace nanscope {

namespace {

// The rows of `step` without which the run survives: halves while one half
// alone does it, else the set where neither half did (several rows together).
std::vector<int64_t> dooming_rows(EarlierSteps& steps, int64_t step, int64_t rows, int& replays) {
  std::vector<int64_t> candidates;
  for (int64_t r = 0; r < rows; ++r) candidates.push_back(r);
  while (candidates.size() > 1) {
    const auto half = candidates.begin() + std::ptrdiff_t(candidates.size() / 2);
    const std::vector<int64_t> left(candidates.begin(), half), right(half, candidates.end());
    ++replays;
    if (steps.survives({step, step, left})) {
      candidates = left;
      continue;
    }
    ++replays;
    if (steps.survives({step, step, right})) {
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
  ++finding.replays;
  if (!steps.survives({applied.front(), applied.back(), {}})) return finding;
  // Invariant: leaving out the updates of applied[lo..hi] saves the run.
  size_t lo = 0, hi = applied.size() - 1;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    ++finding.replays;
    if (steps.survives({applied[lo], applied[mid], {}})) {
      hi = mid;
      continue;
    }
    ++finding.replays;
    if (steps.survives({applied[mid + 1], applied[hi], {}})) {
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
    case DoomOutcome::no_earlier_step: break;
  }
  return "no earlier step";
}

}  // namespace nanscope
