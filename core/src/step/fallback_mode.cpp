#include "nanscope/core/fallback_mode.hpp"

#include <algorithm>
#include <sstream>

namespace nanscope {

std::string fp32_modules_flag_value(const std::vector<std::string>& modules) {
  std::string out;
  for (const auto& m : modules) out += (out.empty() ? "" : ",") + m;
  return out;
}

std::vector<std::string> parse_fp32_modules(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');)
    if (!item.empty() && std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  return out;
}

}  // namespace nanscope
