#pragma once
// What a report says about a run, read once: for each run file (one, or one
// per rank) its rows and events, the summary numbers and its snapshots. The
// text and JSON renderings both draw on this and nothing else.
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/poison_list.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_layout.hpp"
#include "run_location.hpp"
#include "run_summary.hpp"
#include "snapshots.hpp"

namespace nanscope::report {

struct RankReport {
  format::RankFile file;               // rank -1: a one-process run
  std::optional<format::RunData> run;  // nullopt: the file could not be read
  std::string error;                   // why not (names the file)
  bool writer_open = false;            // a writer holds the file: a live run, or a killed one
  RunSummary summary;
  std::vector<SnapshotEntry> snapshots;
};

// The samples the run leaves out (format/poison_list.hpp): every rank's,
// from the one list in the run directory.
struct LeftOut {
  std::string path;
  std::vector<format::PoisonedSample> samples;
  std::string error;  // the list could not be read (a line edited wrong): why
};

struct RunReport {
  std::string input;
  std::vector<RankReport> ranks;
  LeftOut left_out;
};

LeftOut read_left_out(const std::string& run_dir);

// Reads every run file of `location` and its snapshots. A run file that
// cannot be read is kept with its error; snapshots that cannot be are listed
// as unreadable.
RunReport read_report(const std::string& input, const RunLocation& location);
// The same for a run already read (a follower's data).
RankReport rank_report(const std::string& run_dir, const format::RankFile& file, format::RunData run);

}  // namespace nanscope::report
