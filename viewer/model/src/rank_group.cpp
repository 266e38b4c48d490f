#include "nanscope/viewer/rank_group.hpp"

#include <algorithm>
#include <charconv>
#include <climits>

namespace nanscope::viewer {

bool FirstNonfiniteRanks::has(int rank) const {
  return std::binary_search(ranks.begin(), ranks.end(), rank);
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

FirstNonfiniteRanks first_nonfinite_ranks(const std::vector<format::RunEvent>& events, int world_size) {
  FirstNonfiniteRanks first;
  for (const format::RunEvent& e : events) {
    if (e.kind != format::kEventFirstNonfinite || e.step < 0 || (first.known() && e.step >= first.step)) continue;
    if (auto ranks = parse_rank_list(e.text, world_size)) {
      first.step = e.step;
      first.ranks = std::move(*ranks);
    }
  }
  return first;
}

}  // namespace nanscope::viewer
