#pragma once
// A string as a JSON string literal, quotes included: the one escaping rule of
// every JSON nanscope prints (nanscope-replay --json, nanscope-report --json).
#include <cstdio>
#include <string>

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

}  // namespace nanscope
