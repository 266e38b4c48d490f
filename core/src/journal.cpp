#include "nanscope/core/journal.hpp"

namespace nanscope {

const std::string& Journal::record_about(int64_t event_step, int64_t step, format::EventKind kind,
                                         const std::string& text, const std::string& label, const std::string& aside) {
  writer_->event(event_step, kind, text);
  say(step, label + text + aside);
  return text;
}

void Journal::say(int64_t step, const std::string& text) const {
  if (log_) *log_ << log_prefix_ << "step " << step << ": " << text << "\n";
}

}  // namespace nanscope
