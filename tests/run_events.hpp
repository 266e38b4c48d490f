#pragma once
// The events of one kind in a run file, in order: what tests assert on.
#include <vector>

#include "nanscope/format/run_file.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::test {

inline std::vector<format::RunEvent> events_of(const format::RunData& run, format::EventKind kind) {
  std::vector<format::RunEvent> out;
  for (const auto& e : run.events)
    if (e.kind == kind) out.push_back(e);
  return out;
}

}  // namespace nanscope::test
