#include "nanscope/common/error_text.hpp"

#include <c10/util/Exception.h>

namespace nanscope {

std::string one_line_error(const std::exception& e) {
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10 ? c10->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.rfind("The following operation failed in the TorchScript interpreter", 0) == 0) {
    const size_t last = text.find_last_of('\n');
    return last == std::string::npos ? text : text.substr(last + 1);
  }
  const size_t end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace nanscope
