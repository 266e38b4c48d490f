#include "nanscope/common/log_line.hpp"

#include <memory>
#include <mutex>

namespace nanscope {

namespace {

std::mutex sink_mutex;
std::shared_ptr<const LogSink> current_sink;

std::shared_ptr<const LogSink> sink() {
  std::lock_guard<std::mutex> lock(sink_mutex);
  return current_sink;
}

}  // namespace

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  current_sink = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
}

void write_log_line(const LogLine& line, std::ostream* stream) {
  if (!stream) return;  // the lines were turned off
  if (const auto routed = sink()) {
    (*routed)(line);
    return;
  }
  // One write of the whole line; no locale facet formats anything here (a
  // Python extension built against a PyTorch wheel's libstdc++ crashed in
  // num_put).
  const std::string whole = line.text + "\n";
  stream->write(whole.data(), std::streamsize(whole.size()));
  stream->flush();
}

}  // namespace nanscope
