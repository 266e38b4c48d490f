#include "nanscope/viewer/rank_group.hpp"

#include <algorithm>

namespace nanscope::viewer {

bool FirstNonfiniteRanks::has(int rank) const { return std::binary_search(ranks.begin(), ranks.end(), rank); }

FirstNonfiniteRanks first_nonfinite_ranks(const std::vector<format::RunEvent>& events, int world_size) {
  FirstNonfiniteRanks first;
  for (const format::RunEvent& e : events) {
    if (e.kind != format::EventKind::first_nonfinite || e.step < 0 || (first.known() && e.step >= first.step)) continue;
    if (auto ranks = format::parse_rank_list(e.text, world_size)) {
      first.step = e.step;
      first.ranks = std::move(*ranks);
    }
  }
  return first;
}

}  // namespace nanscope::viewer
