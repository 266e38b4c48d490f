#pragma once
// The report for people: the run's summary, then its events section by
// section, then its snapshots. Long sections (hundreds of skips) show their
// first entries and a count; --json lists every one.
#include <cstddef>
#include <ostream>

#include "nanscope/format/run_file.hpp"
#include "run_report.hpp"

namespace nanscope::report {

// `limit`: entries shown per section before "... and N more"; 0 shows all.
void write_text(const RunReport& report, size_t limit, std::ostream& out);

// One event as a line: "step 5  skip  non-finite loss at bf16; optimizer step skipped".
std::string event_line(const format::RunEvent& event);

// A loss or other value for people: "0.4123", "nan", "inf" (never "-nan").
std::string value_text(double value);

}  // namespace nanscope::report
