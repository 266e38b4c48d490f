#pragma once
// Medians and percentiles of timings, written once for the programs (step
// times, frame times) and the benchmarks. 0 for no values.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace nanscope {

// The value at fraction p (0..1) of the sorted values: p = 0.5 is the median
// (the upper one for an even count), p = 0.95 the 95th percentile.
inline double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  const size_t at = std::min(values.size() - 1, size_t(p * double(values.size())));
  std::nth_element(values.begin(), values.begin() + at, values.end());
  return values[at];
}

inline double median(std::vector<double> values) { return percentile(std::move(values), 0.5); }

}  // namespace nanscope
