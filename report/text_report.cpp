#include "text_report.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "event_sections.hpp"
#include "nanscope/common/list_text.hpp"
#include "nanscope/common/number_text.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/format/precision_trail.hpp"

namespace nanscope::report {

namespace {

// The config keys worth a line, in this order; a run holds many more (--json has them all).
constexpr const char* kConfigOfInterest[] = {"model", "amp",      "optimizer", "lr",     "schedule",  "batch_size",
                                             "steps", "fallback", "faults",    "device", "world_size"};

std::string step_range(int64_t first, int64_t last) {
  return first == last ? "step " + std::to_string(first)
                       : "steps " + std::to_string(first) + "-" + std::to_string(last);
}

void write_summary(const RankReport& r, std::ostream& out) {
  const format::RunData& run = *r.run;
  const RunSummary& s = r.summary;
  out << "  file        " << run.path << " (format " << run.format_version << ", origin "
      << format::to_string(run.origin) << ")\n";
  if (r.writer_open) out << "              its writer still has it open: a live run, or one that was killed\n";
  // The config on lines of at most kWidth characters, as a terminal shows them.
  constexpr size_t kWidth = 100;
  const std::string indent = "              ";
  std::string config_line = "  config      ";
  bool first = true;
  for (const char* key : kConfigOfInterest) {
    const auto it = run.config.find(key);
    if (it == run.config.end() || it->second.empty()) continue;
    const std::string entry = std::string(key) + " " + it->second;
    if (!first && config_line.size() + 2 + entry.size() > kWidth) {
      out << config_line << ",\n";
      config_line = indent + entry;
    } else {
      config_line += (first ? "" : ", ") + entry;
    }
    first = false;
  }
  if (!first) out << config_line << "\n";
  if (s.rows == 0) {
    // A run that died at its first step (or a live one before its first
    // flush): what the file holds is its config and its events.
    out << "  steps       none recorded: no step row was written (rows go out every 64 steps or 2 seconds, "
           "and at the end of a run that ends cleanly); it holds its config (above) and "
        << run.events.size() << " event(s)" << (run.events.empty() ? "" : " (below)") << "\n";
    return;
  }
  out << "  steps       " << s.rows << " recorded (" << step_range(*s.first_step, *s.last_step) << "): " << s.counted
      << " counted, " << s.skipped << " skipped";
  if (s.rolled_back > 0) out << ", " << s.rolled_back << " taken back by rollbacks";
  out << "\n";
  out << "  loss        final " << value_text(s.final_loss->value) << " (step " << s.final_loss->step << "); ";
  if (s.last_finite_loss)
    out << "last finite " << value_text(s.last_finite_loss->value) << " (step " << s.last_finite_loss->step << ")\n";
  else
    out << "no finite loss on a step that counted\n";
  std::string amp;
  for (const AmpSpan& span : s.amp)
    amp += (amp.empty() ? "" : ", ") + std::string(format::to_string(span.precision)) + " (" +
           step_range(span.first_step, span.last_step) + ")";
  out << "  amp         " << amp;
  if (s.fp32_from_step) out << "; fp32 from step " << *s.fp32_from_step;
  out << "\n";
  if (s.loss_scale_min)
    out << "  loss scale  " << value_text(*s.loss_scale_min) << " to " << value_text(*s.loss_scale_max)
        << " over the fp16 steps\n";
}

// Prints at most `limit` lines of `lines` (0: all), then how many were left out.
void write_condensed(const std::vector<std::string>& lines, size_t limit, std::ostream& out) {
  const size_t shown = limit == 0 ? lines.size() : std::min(limit, lines.size());
  for (size_t i = 0; i < shown; ++i) out << "  " << lines[i] << "\n";
  if (shown < lines.size()) out << "  ... and " << lines.size() - shown << " more (--json lists every one)\n";
}

void write_events(const RankReport& r, size_t limit, std::ostream& out) {
  const format::RunData& run = *r.run;
  std::vector<std::string> empty;
  for (const EventSection& section : event_sections()) {
    const std::vector<format::RunEvent> events = events_in(run, section);
    if (events.empty()) {
      empty.push_back(section.title);
      continue;
    }
    std::vector<std::string> lines;
    for (const format::RunEvent& e : events) {
      std::string line = event_line(e);
      if (e.kind == format::EventKind::rollback)
        if (const auto span = rollback_span(run, e))
          line += " [" + std::to_string(span->rows_taken_back) + " rows taken back]";
      lines.push_back(line);
    }
    out << section.title << " (" << events.size() << ")\n";
    write_condensed(lines, limit, out);
  }
  if (!empty.empty()) {
    std::string list;
    for (const std::string& title : empty) list += (list.empty() ? "" : ", ") + title;
    out << "none: " << list << "\n";
  }
}

std::vector<std::string> snapshot_lines(const SnapshotEntry& entry) {
  if (!entry.summary) return {"unreadable: " + entry.error};
  const format::SnapshotSummary& s = *entry.summary;
  std::vector<std::string> lines = {"step " + std::to_string(s.step) + " (" + format::step_precision_text(s) +
                                    "): " + entry.path};
  lines.push_back("  first birth: " + format::capture_text(s.capture));
  const std::vector<BirthRow> rows = birth_rows(s);
  if (!rows.empty()) {
    std::string text;
    for (const BirthRow& row : rows) text += (text.empty() ? "" : ", ") + birth_row_text(row);
    lines.push_back("  non-finite: " + text);
  }
  if (!s.replay) {
    lines.push_back("  replay: not replayed yet (" + format::replay_command(s, entry.path) + ")");
    return lines;
  }
  lines.push_back("  replay: verdict " + std::string(format::to_string(s.replay->verdict)) + ", category " +
                  format::to_string(s.replay->category) + "; " + s.replay->suggestion);
  if (s.replay->kernel_trials)
    lines.push_back("  kernels: " + s.replay->kernel_trials->op + ": " +
                    format::kernel_trials_text(*s.replay->kernel_trials));
  if (s.replay->precision_trail)
    lines.push_back("  precision lost: " + format::precision_lost_text(*s.replay->precision_trail));
  return lines;
}

void write_snapshots(const RankReport& r, size_t limit, std::ostream& out) {
  if (r.snapshots.empty()) {
    out << "snapshots: none\n";
    return;
  }
  out << "snapshots (" << r.snapshots.size() << ")\n";
  const size_t shown = limit == 0 ? r.snapshots.size() : std::min(limit, r.snapshots.size());
  for (size_t i = 0; i < shown; ++i)
    for (const std::string& line : snapshot_lines(r.snapshots[i])) out << "  " << line << "\n";
  if (shown < r.snapshots.size())
    out << "  ... and " << r.snapshots.size() - shown << " more (--json lists every one)\n";
}

}  // namespace

std::string value_text(double value) {
  if (std::isnan(value)) return "nan";
  return number_text(value);
}

std::string event_line(const format::RunEvent& event) {
  return "step " + std::to_string(event.step) + "  " + format::to_string(event.kind) + "  " + event.text;
}

// "left out: 3 samples since step 40: data set rows 5, 9 and 12 (PATH) ...".
void write_left_out(const LeftOut& left_out, std::ostream& out) {
  if (!left_out.error.empty()) {
    out << "\nleft out: the run's poison list is unreadable: " << left_out.error << "\n";
    return;
  }
  if (left_out.samples.empty()) return;
  int64_t since = left_out.samples.front().step;
  std::vector<std::string> rows;
  for (const format::PoisonedSample& s : left_out.samples) {
    since = std::min(since, s.step);
    rows.push_back(std::to_string(s.row));
  }
  const size_t n = left_out.samples.size();
  out << "\nleft out: " << n << (n == 1 ? " sample" : " samples")
      << (since == format::kListedBeforeTheRun ? " listed before the run" : " since step " + std::to_string(since))
      << ": data set " << (n == 1 ? "row " : "rows ") << first_few_text(rows, 10) << "\n";
  out << "  each epoch from then on leaves them out (" << left_out.path << "; delete a line to restore its sample)\n";
}

void write_text(const RunReport& report, size_t limit, std::ostream& out) {
  const bool ranks = report.ranks.size() > 1 || (!report.ranks.empty() && report.ranks.front().file.rank >= 0);
  for (size_t i = 0; i < report.ranks.size(); ++i) {
    const RankReport& r = report.ranks[i];
    if (i > 0) out << "\n";
    out << (ranks ? "rank " + std::to_string(r.file.rank) : std::string("run")) << ": " << r.file.path << "\n";
    if (!r.run) {
      out << "  unreadable: " << r.error << "\n";
      continue;
    }
    write_summary(r, out);
    write_events(r, limit, out);
    write_snapshots(r, limit, out);
  }
  write_left_out(report.left_out, out);
}

}  // namespace nanscope::report
