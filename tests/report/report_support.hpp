#pragma once
// What the nanscope-report tests share: the tool run as a user runs it, its
// output as lines, and a JSON document read by Python's own parser.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/json_check.hpp"
#include "../support/test_support.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::test {

// The version this nanscope writes, as the report prints it ("1.3").
inline std::string format_version_text() {
  return std::to_string(format::kFormatMajor) + "." + std::to_string(format::kFormatMinor);
}

inline const std::string kReport = test::paths::report_exe;

inline CommandResult report_tool(const std::string& args) { return run_command(kReport + " " + args); }

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline bool has_line(const std::string& text, const std::string& line) {
  for (const std::string& l : lines_of(text))
    if (l == line) return true;
  return false;
}

}  // namespace nanscope::test
