#include "json_writer.hpp"

#include <stdexcept>

namespace nanscope::report {

void JsonWriter::newline() { out_ << '\n' << std::string(2 * has_items_.size(), ' '); }

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (has_items_.empty()) return;
  if (has_items_.back()) out_ << ',';
  has_items_.back() = true;
  newline();
}

JsonWriter& JsonWriter::key(const std::string& name) {
  before_value();
  out_ << json_quoted(name) << ": ";
  after_key_ = true;
  return *this;
}

void JsonWriter::begin_object() {
  before_value();
  out_ << '{';
  has_items_.push_back(false);
}

void JsonWriter::begin_array() {
  before_value();
  out_ << '[';
  has_items_.push_back(false);
}

void JsonWriter::end_object() {
  const bool had_items = has_items_.back();
  has_items_.pop_back();
  if (had_items) newline();
  out_ << '}';
}

void JsonWriter::end_array() {
  const bool had_items = has_items_.back();
  has_items_.pop_back();
  if (had_items) newline();
  out_ << ']';
}

void JsonWriter::value(const std::string& text) {
  before_value();
  out_ << json_quoted(text);
}

void JsonWriter::value(int64_t number) {
  before_value();
  out_ << number;
}

void JsonWriter::value(double number) {
  before_value();
  out_ << json_number(number);
}

void JsonWriter::value(bool flag) {
  before_value();
  out_ << (flag ? "true" : "false");
}

void JsonWriter::null() {
  before_value();
  out_ << "null";
}

void JsonWriter::finish() {
  if (!has_items_.empty()) throw std::logic_error("JsonWriter: an object or array was left open");
  out_ << '\n';
}

}  // namespace nanscope::report
