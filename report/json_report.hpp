#pragma once
// The report as one JSON object (--json), every event and snapshot in full:
//   { "input": ..., "runs": [ { "rank", "path", "error", "format_version",
//     "origin", "writer_open", "config", "summary", "event_counts", "events",
//     "rollbacks", "snapshots" }, ... ] }
// One entry in "runs" per run file: one for a one-process run ("rank": null),
// one per rank otherwise. docs/report.md lists the fields.
#include <ostream>

#include "run_report.hpp"

namespace nanscope::report {

void write_json(const RunReport& report, std::ostream& out);

}  // namespace nanscope::report
