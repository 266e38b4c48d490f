#include "event_sections.hpp"

#include <algorithm>

namespace nanscope::report {

using format::EventKind;

const std::vector<EventSection>& event_sections() {
  static const std::vector<EventSection> sections = {
      {"skips", {EventKind::skip}},
      {"losses over nothing", {EventKind::empty_loss}},
      {"first births", {EventKind::first_birth}},
      {"warnings", {EventKind::warning}},
      {"rollbacks", {EventKind::rollback}},
      {"dooming steps", {EventKind::doom}},
      {"fallbacks and remedies", {EventKind::fallback, EventKind::remedy}},
      {"loss scale backoffs", {EventKind::scale_backoff}},
      {"refused saves", {EventKind::save_refused}},
      {"stop", {EventKind::stop}},
      {"resumes", {EventKind::resume}},
      {"ranks", {EventKind::first_nonfinite, EventKind::nonfinite_ranks, EventKind::dist_error}},
      {"snapshot events", {EventKind::snapshot, EventKind::snapshot_failed, EventKind::snapshot_skipped}},
      {"events of unknown kinds", {EventKind::unknown}},  // a newer nanscope's words
  };
  return sections;
}

std::vector<format::RunEvent> events_in(const format::RunData& run, const EventSection& section) {
  std::vector<format::RunEvent> out;
  for (const format::RunEvent& e : run.events)
    if (std::find(section.kinds.begin(), section.kinds.end(), e.kind) != section.kinds.end()) out.push_back(e);
  return out;
}

}  // namespace nanscope::report
