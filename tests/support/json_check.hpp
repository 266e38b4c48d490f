#pragma once
// JSON a tool printed, checked by the one strict reader every test trusts:
// Python's json module. The test program names paths::python (nanscope_test_paths).
#include <string>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace nanscope::test {

// Loads `json_path` with Python's json module (strictly: NaN and Infinity,
// which it would accept, fail the test too) and prints `expression` over it, the document being `d`.
// Expressions use double quotes only.
inline std::string python_json(const std::string& json_path, const std::string& expression) {
  const CommandResult r = run_command(
      std::string(test::paths::python) +
      " -c 'import json,sys; d=json.load(open(sys.argv[1]), parse_constant=lambda c: sys.exit(\"not JSON: \" + c)); "
      "print(" +
      expression + ")' " + json_path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace nanscope::test
