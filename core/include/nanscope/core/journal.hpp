#pragma once
// The run's journal: each decision the step guard makes is said by one call,
// which writes its event into run.h5 and its log line in the same words and
// returns the text for the step's result, so the three cannot drift apart.
// Events with no line of their own (a snapshot's path, a skip's details) and
// lines with no event (a skip's one-line summary) have calls of their own.
#include <atomic>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "nanscope/format/run_file.hpp"

namespace nanscope {

class Journal {
 public:
  // `log`: nullptr for none; each line starts with `log_prefix` ("[rank 1] "),
  // then, while several guards are alive in the process (a GAN's generator
  // and critic), with the name of the model this journal's guard steers.
  Journal(std::ostream* log, std::string log_prefix, std::string model_name);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  void open(std::unique_ptr<format::RunWriter> writer) { writer_ = std::move(writer); }

  // A decision about `step`: the event `kind` with `text`, and the log line
  // "step STEP: <label>text<aside>" (aside: what only the log says, such as
  // what the decision cost). Returns `text`, for the result's field.
  const std::string& record(int64_t step, format::EventKind kind, const std::string& text,
                            const std::string& label = "", const std::string& aside = "") {
    return record_about(step, step, kind, text, label, aside);
  }
  // The same, the event at `event_step`: a decision made at `step` about an
  // earlier one (the step that doomed it).
  const std::string& record_about(int64_t event_step, int64_t step, format::EventKind kind, const std::string& text,
                                  const std::string& label = "", const std::string& aside = "");
  // run.h5 only.
  void event(int64_t step, format::EventKind kind, const std::string& text) { writer_->event(step, kind, text); }
  // The log only.
  void say(int64_t step, const std::string& text) const;
  void flush() { writer_->flush(); }
  format::RunWriter& writer() { return *writer_; }
  const format::RunWriter& writer() const { return *writer_; }

 private:
  std::ostream* log_;
  std::string log_prefix_;
  std::string model_name_;
  static std::atomic<int> alive_;  // journals in this process
  std::unique_ptr<format::RunWriter> writer_;
};

}  // namespace nanscope
