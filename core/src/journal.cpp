#include "nanscope/core/journal.hpp"

namespace nanscope {

const std::string& Journal::record_about(int64_t event_step, int64_t step, format::EventKind kind,
                                         const std::string& text, const std::string& label, const std::string& aside) {
  writer_->event(event_step, kind, text);
  say(step, label + text + aside);
  return text;
}

std::atomic<int> Journal::alive_{0};

Journal::Journal(std::ostream* log, std::string log_prefix, std::string model_name)
    : log_(log), log_prefix_(std::move(log_prefix)), model_name_(std::move(model_name)) {
  ++alive_;
}

Journal::~Journal() { --alive_; }

void Journal::say(int64_t step, const std::string& text) const {
  if (!log_) return;
  // One write of the whole line: lines of ranks and threads do not interleave,
  // and no locale facet formats the number (a Python extension built against
  // a PyTorch wheel's libstdc++ crashed in num_put there).
  const std::string line = log_prefix_ + (alive_.load() > 1 ? "[" + model_name_ + "] " : std::string()) + "step " +
                           std::to_string(step) + ": " + text + "\n";
  log_->write(line.data(), std::streamsize(line.size()));
  log_->flush();
}

}  // namespace nanscope
