#pragma once
// nanscope-report: a run read as text (or JSON) on a machine with no display.
// The command line fills ReportOptions; run() does the rest, so it is
// testable without argv.
#include <cstddef>
#include <ostream>
#include <string>

namespace nanscope::report {

struct ReportOptions {
  std::string input;        // a run directory, or one run file
  bool json = false;        // one JSON object with everything, instead of the text
  size_t limit = 10;        // text: entries per section before "... and N more"; 0: all
  bool follow = false;      // follow a live run (follow.hpp says until when)
  double interval_s = 10;   // --follow: seconds between progress lines
  double until_idle_s = 0;  // --follow: end after this long with nothing new; 0: never
};

// Prints the report to `out` and returns the exit code: kExitOk; kExitBadInput
// with one line per bad file on `err` (a missing input, a directory with no
// run file, a file that is no run file or is corrupt; the other ranks of a
// run are still reported); kExitInterrupted when Ctrl-C ended --follow.
int run(const ReportOptions& options, std::ostream& out, std::ostream& err);

}  // namespace nanscope::report
