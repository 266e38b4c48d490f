#pragma once
// What the nanscope-report tests share: the tool run as a user runs it, its
// output as lines, and a JSON document read by Python's own parser.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/test_support.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::test {

// The version this nanscope writes, as the report prints it ("1.3").
inline std::string format_version_text() {
  return std::to_string(format::kFormatMajor) + "." + std::to_string(format::kFormatMinor);
}

inline const std::string kReport = NANSCOPE_REPORT_EXE;

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

// Loads `json_path` with Python's json module (strictly: NaN and Infinity,
// which it would accept, fail the test too) and prints `expression` over it, the document being `d`.
// Expressions use double quotes only.
inline std::string python_json(const std::string& json_path, const std::string& expression) {
  const CommandResult r = run_command(
      std::string(NANSCOPE_PYTHON) +
      " -c 'import json,sys; d=json.load(open(sys.argv[1]), parse_constant=lambda c: sys.exit(\"not JSON: \" + c)); "
      "print(" +
      expression + ")' " + json_path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace nanscope::test
