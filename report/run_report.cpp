#include "run_report.hpp"

#include "nanscope/format/error.hpp"

namespace nanscope::report {

namespace {

bool writer_still_open(const std::string& path) {
  try {
    return format::has_writer_mark(path);
  } catch (const format::FormatError&) {
    return false;  // the run file was read a moment ago; its mark is not worth an error
  }
}

}  // namespace

RankReport rank_report(const std::string& run_dir, const format::RankFile& file, format::RunData run) {
  RankReport r;
  r.file = file;
  r.summary = summarize_run(run);
  r.run = std::move(run);
  r.writer_open = writer_still_open(file.path);
  r.snapshots = read_snapshots(run_dir, file.rank);
  return r;
}

LeftOut read_left_out(const std::string& run_dir) {
  LeftOut out;
  out.path = format::poison_list_path(run_dir);
  try {
    out.samples = format::read_poison_list(out.path);
  } catch (const format::FormatError& e) {
    out.error = e.what();
  }
  return out;
}

RunReport read_report(const std::string& input, const RunLocation& location) {
  RunReport report;
  report.input = input;
  report.left_out = read_left_out(location.run_dir);
  for (const format::RankFile& file : location.files) {
    try {
      format::clear_mark_if_writer_gone(file.path);  // a killed writer's file opens in plain h5py then
      // The report names no layer: the per-layer tables, most of a long run's bytes, stay unread.
      report.ranks.push_back(
          rank_report(location.run_dir, file, format::read_run(file.path, format::LayerTables::skip)));
    } catch (const format::FormatError& e) {
      RankReport unreadable;
      unreadable.file = file;
      unreadable.error = e.what();
      report.ranks.push_back(std::move(unreadable));
    }
  }
  return report;
}

}  // namespace nanscope::report
