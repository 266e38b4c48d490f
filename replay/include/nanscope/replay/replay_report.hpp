#pragma once
// Renders a replay: a report for people, the JSON of docs/replay.md, and
// a `replay` group appended to the snapshot for the viewer.
#include <string>

#include "nanscope/replay/replay.hpp"

namespace nanscope::replay {

std::string to_text(const ReplayReport& report);
std::string to_json(const ReplayReport& report);
// Replaces /replay in the snapshot. Throws format::FormatError.
void append_to_snapshot(const std::string& path, const ReplayReport& report);

}  // namespace nanscope::replay
