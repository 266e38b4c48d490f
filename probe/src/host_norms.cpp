#include "nanscope/probe/host_norms.hpp"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_memory.hpp"
#include "vector_clones.hpp"

namespace nanscope::probe {

namespace {

// Eight floats at a time, widened to double before they are squared (the
// sum of a million squares keeps the precision a float sum would lose), into
// two sums of four lanes: each an AVX2 register, so that none goes through memory.
NANSCOPE_VECTOR_CLONES double sum_of_squares(const float* values, int64_t n) {
  using Floats = float __attribute__((vector_size(16)));
  using Doubles = double __attribute__((vector_size(32)));
  Doubles low_sums = {}, high_sums = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Floats low, high;
    std::memcpy(&low, values + i, sizeof low);
    std::memcpy(&high, values + i + 4, sizeof high);
    const Doubles wide_low = __builtin_convertvector(low, Doubles);
    const Doubles wide_high = __builtin_convertvector(high, Doubles);
    low_sums += wide_low * wide_low;
    high_sums += wide_high * wide_high;
  }
  const Doubles sums = low_sums + high_sums;
  double total = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  for (; i < n; ++i) total += double(values[i]) * double(values[i]);
  return total;
}

// A small tensor in one pass on this thread; a large one in pieces on LibTorch's threads.
constexpr int64_t kNormGrain = int64_t(1) << 18;

double squared_norm(const float* values, int64_t n) {
  return at::parallel_reduce(
      0, n, kNormGrain, 0.0,
      [&](int64_t begin, int64_t end, double sum) { return sum + sum_of_squares(values + begin, end - begin); },
      [](double a, double b) { return a + b; });
}

// Beyond this squared total a float sum of squares may overflow (LibTorch's).
constexpr double kLargestTrustedSquare = 1e36;

}  // namespace

std::optional<std::vector<double>> squared_norms_on_host(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (!in_host_memory(t) || t.scalar_type() != at::kFloat || !t.is_contiguous()) return std::nullopt;
  std::vector<double> squares;
  squares.reserve(tensors.size());
  double total = 0;
  for (const at::Tensor& t : tensors) {
    squares.push_back(t.numel() == 0 ? 0.0 : squared_norm(t.data_ptr<float>(), t.numel()));
    total += squares.back();
  }
  // A NaN or an infinity anywhere makes the total one.
  if (!std::isfinite(total) || total >= kLargestTrustedSquare) return std::nullopt;
  return squares;
}

}  // namespace nanscope::probe
