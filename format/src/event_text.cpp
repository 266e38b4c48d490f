#include "nanscope/format/event_text.hpp"

#include <sstream>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

namespace {

std::string number(double v, int digits = 3) {
  std::ostringstream s;
  s.precision(digits);
  s << v;
  return s.str();
}

constexpr const char* kRollbackPrefix = "to step ";

}  // namespace

std::string warning_text(const WarningFields& w) {
  std::string t = w.signal + (w.where.empty() ? "" : " in '" + w.where + "'") + ": " + number(w.value) + " against " +
                  number(w.baseline);
  if (w.steps_to_limit) t += ", the precision's limit in about " + number(*w.steps_to_limit) + " steps";
  return t;
}

std::string warning_where(const std::string& text) {
  const auto open = text.find(" in '");
  const auto colon = text.find(": ");
  if (open == std::string::npos || (colon != std::string::npos && colon < open)) return "";
  const auto close = text.find("': ", open + 5);
  return close == std::string::npos ? "" : text.substr(open + 5, close - open - 5);
}

std::string rollback_text(const RollbackFields& r) {
  std::string t = kRollbackPrefix + std::to_string(r.to_step) + ": steps " + std::to_string(r.to_step + 1) + "-" +
                  std::to_string(r.failed_step) + " do not count and their batches are skipped; LR x " +
                  number(r.lr_factor) + " -> " + number(r.new_lr, 4);
  if (!r.why.empty()) t += " (" + r.why + ")";
  return t;
}

namespace {
// The step number at `at` in `text`, followed by ':' ("12: ..."); nullopt for
// anything else, too long a number included (garbled, never guessed).
std::optional<int64_t> step_before_colon(const std::string& text, size_t at) {
  size_t i = at, digits = 0;
  int64_t step = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 18) {
    step = step * 10 + (text[i++] - '0');
    ++digits;
  }
  if (digits == 0 || i >= text.size() || text[i] != ':') return std::nullopt;
  return step;
}
}  // namespace

std::optional<int64_t> doomed_step(const std::string& text) {
  static const std::string about = "doomed step ";
  const size_t at = text.find(about);
  return at == std::string::npos ? std::nullopt : step_before_colon(text, at + about.size());
}

std::optional<int64_t> rollback_target(const std::string& text) {
  const std::string prefix = kRollbackPrefix;
  if (text.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  return step_before_colon(text, prefix.size());
}

std::vector<uint8_t> rolled_back_rows(const RunData& run) {
  std::vector<uint8_t> out(run.rows(), 0);
  for (const RunEvent& e : run.events) {
    if (e.kind != EventKind::rollback) continue;
    const std::optional<int64_t> to = rollback_target(e.text);
    if (!to) continue;
    for (size_t i = 0; i < run.rows(); ++i)
      if (run.step[i] > *to && run.step[i] <= e.step) out[i] = 1;
  }
  return out;
}

}  // namespace nanscope::format
