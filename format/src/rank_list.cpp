#include <algorithm>
#include <charconv>
#include <climits>

#include "nanscope/format/run_file.hpp"

namespace nanscope::format {

std::string rank_list_text(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ",") + std::to_string(r);
  return text;
}

std::optional<std::vector<int>> parse_rank_list(const std::string& text, int world_size) {
  std::vector<int> ranks;
  const char* p = text.data();
  const char* const end = p + text.size();
  auto skip_spaces = [&] {
    while (p != end && (*p == ' ' || *p == '\t')) ++p;
  };
  for (;;) {
    skip_spaces();
    // Unsigned: from_chars would take "-1" as a signed int.
    unsigned long value = 0;
    const auto [next, ec] = std::from_chars(p, end, value);
    if (ec != std::errc() || next == p || value > unsigned(INT_MAX)) return std::nullopt;
    if (world_size > 0 && value >= unsigned(world_size)) return std::nullopt;
    ranks.push_back(int(value));
    p = next;
    skip_spaces();
    if (p == end) break;
    if (*p++ != ',') return std::nullopt;
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace nanscope::format
