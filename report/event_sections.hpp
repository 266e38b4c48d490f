#pragma once
// The report's sections of events: which event kinds each gathers, in the
// order a person reading a failed run wants them (what was skipped, where it
// was born, what warned, what the run did about it, how it ended).
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"

namespace nanscope::report {

struct EventSection {
  std::string title;  // "skips", "first births", ...
  std::vector<format::EventKind> kinds;
};

// Every event kind is in exactly one section (the snapshot events too: the
// snapshots section lists the files they name).
const std::vector<EventSection>& event_sections();

// The events of a section's kinds, in the run's order.
std::vector<format::RunEvent> events_in(const format::RunData& run, const EventSection& section);

}  // namespace nanscope::report
