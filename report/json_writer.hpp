#pragma once
// A small JSON writer for --json: objects, arrays, strings, integers, numbers,
// booleans and null, laid out two spaces a level. JSON has no NaN or
// infinity, and a report must say when a loss was one: non-finite numbers are
// written as the strings "nan", "inf" and "-inf".
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "nanscope/common/json_text.hpp"

namespace nanscope::report {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  // The key of the next value inside an object.
  JsonWriter& key(const std::string& name);

  void value(const std::string& text);
  void value(const char* text) { value(std::string(text)); }
  void value(int64_t number);
  void value(int number) { value(int64_t(number)); }
  void value(size_t count) { value(int64_t(count)); }
  void value(double number);
  void value(bool flag);
  void null();
  template <typename T>
  void value(const std::optional<T>& maybe) {
    if (maybe)
      value(*maybe);
    else
      null();
  }
  // Ends the document with a newline; every object and array must be closed.
  void finish();

 private:
  void before_value();
  void newline();

  std::ostream& out_;
  std::vector<bool> has_items_;  // one per open object or array
  bool after_key_ = false;
};

using nanscope::json_quoted;

}  // namespace nanscope::report
