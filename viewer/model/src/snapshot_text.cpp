#include "nanscope/viewer/snapshot_text.hpp"

#include <charconv>

#include "nanscope/format/row_text.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::viewer {

namespace {

// /replay@samples: "2,5" (batch rows). A garbled entry is left out.
std::vector<int64_t> parse_rows(const std::string& text) {
  std::vector<int64_t> rows;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int64_t row = 0;
    const auto [next, ec] = std::from_chars(p, end, row);
    if (ec == std::errc() && row >= 0) rows.push_back(row);
    p = next;
    while (p < end && *p != ',') ++p;
    if (p < end) ++p;
  }
  return rows;
}

}  // namespace

std::vector<std::string> offending_sample_lines(const format::SnapshotSummary& s) {
  std::vector<std::string> lines;
  const std::vector<int64_t>& batch_rows = s.batch_rows;
  if (s.capture.first_birth && s.capture.first_birth->sample >= 0) {
    lines.push_back(format::batch_rows_text(batch_rows, {s.capture.first_birth->sample}) + " arrived non-finite");
  } else if (s.capture.first_birth && !s.capture.first_birth->rows.empty()) {
    const format::Birth& b = *s.capture.first_birth;
    const size_t batch = batch_rows.size();
    if (batch > 0 && b.rows.size() >= batch)
      lines.push_back(b.op.op + " made every row of the batch (" + std::to_string(batch) +
                      ") non-finite: not one sample's doing");
    else
      lines.push_back(b.op.op + " made " + format::batch_rows_text(batch_rows, b.rows) +
                      (b.rows.size() >= format::kBirthRowsKept
                           ? ", ... (the first " + std::to_string(b.rows.size()) + ")"
                           : std::string()) +
                      (batch > 0 ? " of " + std::to_string(batch) : std::string()) + " non-finite");
  }
  if (s.replay && !s.replay->samples.empty()) {
    const std::vector<int64_t> samples = parse_rows(s.replay->samples);
    if (!samples.empty())
      lines.push_back("replay: the step is finite without " + format::batch_rows_text(batch_rows, samples));
  }
  return lines;
}

std::string replay_reruns_line(const format::SnapshotSummary& s) {
  if (!s.replay) return "";
  const format::ReplayRecord& r = *s.replay;
  return "re-run at " + format::step_precision_name(s.precision, r.widened_weights) + ": non-finite in " +
         std::to_string(r.reproduced_count) + " of " + std::to_string(r.repeats) +
         "; fp32: " + (r.fp32_finite ? "finite" : "non-finite") +
         (r.widened_weights.empty() ? "" : " (its " + r.widened_weights + " weights widened to float32)");
}

}  // namespace nanscope::viewer
