#include "snapshots.hpp"

#include "nanscope/format/error.hpp"
#include "run_location.hpp"

namespace nanscope::report {

std::vector<SnapshotEntry> read_snapshots(const std::string& run_dir, int rank) {
  std::vector<SnapshotEntry> entries;
  for (const std::string& path : snapshot_files(run_dir, rank)) {
    SnapshotEntry entry{path, std::nullopt, ""};
    try {
      entry.summary = format::read_snapshot_summary(path);
    } catch (const format::FormatError& e) {
      entry.error = e.what();
    } catch (const std::exception& e) {
      entry.error = "'" + path + "': " + e.what();
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<BirthRow> birth_rows(const format::SnapshotSummary& snapshot) {
  const std::optional<format::Birth>& birth = snapshot.capture.first_birth;
  if (!birth) return {};
  const std::vector<int64_t> positions = birth->sample >= 0 ? std::vector<int64_t>{birth->sample} : birth->rows;
  std::vector<BirthRow> rows;
  for (int64_t position : positions) {
    BirthRow row{position, std::nullopt};
    if (position >= 0 && size_t(position) < snapshot.batch_rows.size() && snapshot.batch_rows[position] >= 0)
      row.dataset_row = snapshot.batch_rows[position];
    rows.push_back(row);
  }
  return rows;
}

std::string birth_row_text(const BirthRow& row) {
  return "batch row " + std::to_string(row.batch_row) + " (data set row " +
         (row.dataset_row ? std::to_string(*row.dataset_row) : std::string("unknown")) + ")";
}

}  // namespace nanscope::report
