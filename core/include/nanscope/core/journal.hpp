#pragma once
// The run's journal: each decision the step guard makes is said by one call,
// which writes its event into run.h5 and its log line in the same words and
// returns the text for the step's result, so the three cannot drift apart.
// Events with no line of their own (a snapshot's path, a skip's details) and
// lines with no event (a skip's one-line summary) have calls of their own.
//
// run.h5 opens at the first row or event, not before: a guard whose state is
// put back before its first step (a resumed run) goes on appending to the
// file it wrote then, instead of starting a new one (the opener decides).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "nanscope/format/run_file.hpp"

namespace nanscope {

class Journal {
 public:
  using Opener = std::function<std::unique_ptr<format::RunWriter>()>;
  // `log`: nullptr for no lines; each line starts with `log_prefix` ("[rank 1] "),
  // then, while several guards are alive in the process (a GAN's generator
  // and critic), with the name of the model this journal's guard steers, or,
  // where another alive guard's model has the same name (C++'s default
  // "model", two `nn.Sequential`), with the folder of this journal's run file.
  // `path` is the run file `open` writes when the first row or event comes.
  Journal(std::ostream* log, std::string log_prefix, std::string model_name, int rank, std::string path, Opener open);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

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
  void event(int64_t step, format::EventKind kind, const std::string& text) { writer().event(step, kind, text); }
  // The log only: "step STEP: text". `routine`: a line of the run's normal
  // course (the loss scaler's backoff), not one asking for attention.
  void say(int64_t step, const std::string& text, bool routine = false) const;
  // The log only, a line about no step (the run's opening line).
  void announce(const std::string& text) const;
  void flush() {
    if (writer_) writer_->flush();
  }
  // Writes what is buffered and closes run.h5, as a program's end does (its
  // mark for writing cleared): for a process about to die (journal_endings.cpp).
  void close_file() { writer_.reset(); }
  format::RunWriter& writer();  // opens run.h5 if nothing was written yet
  const std::string& path() const { return path_; }
  const std::string& model_name() const { return model_name_; }
  bool opened() const { return writer_ != nullptr; }

 private:
  void write_line(int64_t step, const std::string& text, bool warning) const;
  std::string guard_tag() const;  // "[critic] ", or "" for the process's only guard

  std::ostream* log_;
  std::string log_prefix_;
  std::string model_name_;
  int rank_;
  std::string path_;
  Opener open_;
  static std::atomic<int> alive_;  // journals in this process
  std::unique_ptr<format::RunWriter> writer_;
};

}  // namespace nanscope
