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
  *log_ << log_prefix_ << (alive_.load() > 1 ? "[" + model_name_ + "] " : std::string()) << "step " << step << ": "
        << text << "\n";
}

}  // namespace nanscope
