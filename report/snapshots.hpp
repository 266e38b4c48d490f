#pragma once
// A run's snapshots as a report lists them: each file's step and first birth,
// the batch rows the birth made non-finite mapped to data-set rows, and
// replay's verdict when nanscope-replay has been run on it. A snapshot that
// cannot be read is listed with why, never fatal: the run file is the report.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/snapshot_summary.hpp"

namespace nanscope::report {

struct SnapshotEntry {
  std::string path;
  std::optional<format::SnapshotSummary> summary;  // nullopt: unreadable
  std::string error;                               // why it is unreadable (names the file)
};

// Every snapshot of rank `rank` (-1: a one-process run) in `run_dir`, in step order.
std::vector<SnapshotEntry> read_snapshots(const std::string& run_dir, int rank);

// A batch row the first birth made non-finite and the data-set row it came
// from; nullopt when the step was given no data-set rows (a -1 in /batch/rows)
// or the snapshot holds fewer rows than the birth names.
struct BirthRow {
  int64_t batch_row = 0;
  std::optional<int64_t> dataset_row;
};
// An input birth's row (Birth::sample), else the rows an internal birth made
// non-finite (Birth::rows, format 1.2); empty when the capture names none.
std::vector<BirthRow> birth_rows(const format::SnapshotSummary& snapshot);
// "batch row 2 (data set row 42)", "batch row 3 (data set row unknown)".
std::string birth_row_text(const BirthRow& row);

}  // namespace nanscope::report
