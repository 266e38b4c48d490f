#pragma once
// The pieces of every JSON nanscope prints (nanscope-replay --json,
// nanscope-report --json, the doom search's finding): one escaping rule for
// strings and one shape for lists.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace nanscope {

inline std::string json_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          out += escaped;
        } else {
          out += c;  // bytes of UTF-8 pass through as they are
        }
    }
  }
  return out + "\"";
}

// A number as JSON: the shortest text that reads back, and a non-finite one
// (which JSON has no word for) as the string "nan", "inf" or "-inf".
inline std::string json_number(double number) {
  if (std::isnan(number)) return "\"nan\"";
  if (std::isinf(number)) return number > 0 ? "\"inf\"" : "\"-inf\"";
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, number).ptr;
  return std::string(text, end);
}

// [a, b, c]: each item as render(item) makes it.
template <typename T, typename Render>
std::string list_json(const std::vector<T>& items, Render render) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + render(items[i]);
  return out + "]";
}

}  // namespace nanscope
