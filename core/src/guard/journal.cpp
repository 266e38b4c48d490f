#include "nanscope/core/journal.hpp"

#include <filesystem>

#include "guard/journal_endings.hpp"
#include "nanscope/common/log_line.hpp"

namespace nanscope {

const std::string& Journal::record_about(int64_t event_step, int64_t step, format::EventKind kind,
                                         const std::string& text, const std::string& label, const std::string& aside) {
  writer().event(event_step, kind, text);
  say(step, label + text + aside);
  return text;
}

std::atomic<int> Journal::alive_{0};

Journal::Journal(std::ostream* log, std::string log_prefix, std::string model_name, int rank, std::string path,
                 Opener open)
    : log_(log),
      log_prefix_(std::move(log_prefix)),
      model_name_(std::move(model_name)),
      rank_(rank),
      path_(std::move(path)),
      open_(std::move(open)) {
  ++alive_;
  register_journal(this);
}

Journal::~Journal() {
  unregister_journal(this);
  --alive_;
}

format::RunWriter& Journal::writer() {
  if (!writer_) writer_ = open_();
  return *writer_;
}

void Journal::say(int64_t step, const std::string& text, bool routine) const {
  write_line(step, guard_tag() + "step " + std::to_string(step) + ": " + text, !routine);
}

std::string Journal::guard_tag() const {
  if (alive_.load() < 2) return "";
  if (open_journals_named(model_name_) < 2) return "[" + model_name_ + "] ";
  const std::string folder = std::filesystem::path(path_).parent_path().string();
  return "[" + (folder.empty() ? path_ : folder) + "] ";
}

void Journal::announce(const std::string& text) const { write_line(-1, text, false); }

void Journal::write_line(int64_t step, const std::string& text, bool warning) const {
  write_log_line({log_prefix_ + text, step, rank_, model_name_, warning}, log_);
}

}  // namespace nanscope
