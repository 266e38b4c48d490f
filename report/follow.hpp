#pragma once
// --follow: a live run's events as they are committed, and a progress line
// every interval, then the report of the run as it ended.
//
// Following ends, and the report is printed, when every run file has ended —
// its run wrote a `stop` event, or its writer closed it (the run finished, or
// ended on an error or Ctrl-C of its own: the trainer closes its file on each)
// — or, with `until_idle_s`, when nothing new was committed for that long (a
// killed writer never closes its file). Ctrl-C ends it too (exit 130). A run
// directory with no run file yet is waited for; a run file that cannot be
// opened for kOpenGraceSeconds (a writer creates it, then starts SWMR
// writing: in between no reader can open it) is bad input.
#include <cstddef>
#include <ostream>
#include <string>

namespace nanscope::report {

struct FollowOptions {
  double interval_s = 10;   // between progress lines
  double until_idle_s = 0;  // end after this long with nothing new; 0: never
  size_t limit = 10;        // events already in the file shown when following starts (the last ones)
};

inline constexpr double kOpenGraceSeconds = 5;

// Returns the exit code: kExitOk, or kExitInterrupted after Ctrl-C. Throws
// format::FormatError naming the file for bad input (missing, not a run file,
// corrupt, or no run file appeared before following went idle).
int follow_run(const std::string& input, const FollowOptions& options, std::ostream& out);

}  // namespace nanscope::report
