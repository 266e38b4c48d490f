#pragma once
// Where nanscope's lines go. A program's lines go to a stream (std::cerr), one
// write per line, so that the lines of ranks and threads never interleave. A
// host that has its own place for them routes every line there instead, with
// what it is about: Python's module sends them to the logging module (logger
// "nanscope"), where Jupyter, contextlib.redirect_stderr and logging handlers
// see them, which a write to file descriptor 2 never reaches.
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace nanscope {

struct LogLine {
  std::string text;      // the whole line as the stream would get it, without its newline
  int64_t step = -1;     // the step it is about; -1: none
  int rank = 0;          // the process's rank among several (0 alone)
  std::string model;     // the guarded model's name; "" for a line about no model
  bool warning = false;  // worth a user's attention (a skip, a fallback, an early warning), not routine
};

using LogSink = std::function<void(const LogLine&)>;

// Process-wide: every line goes to `sink` from now on; an empty sink puts
// the streams back.
void set_log_sink(LogSink sink);

// `line` to the sink if one is set, else to `stream`; nowhere when `stream`
// is nullptr (the lines turned off).
void write_log_line(const LogLine& line, std::ostream* stream);

}  // namespace nanscope
