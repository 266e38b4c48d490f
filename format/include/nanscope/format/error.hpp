#pragma once
// The one error type at the file boundary: every failure to read or write a
// nanscope file names the file and says what was expected.
#include <stdexcept>
#include <string>

namespace nanscope::format {

class FormatError : public std::runtime_error {
 public:
  FormatError(const std::string& path, const std::string& what)
      : std::runtime_error("'" + path + "': " + what), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writing failed (disk full, no permission): the input was fine, the
// machine was not. Tools exit 1 for it, not 2.
class WriteError : public FormatError {
 public:
  using FormatError::FormatError;
};

}  // namespace nanscope::format
