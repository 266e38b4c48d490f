// The gradient norms read on the host: equal to the norm of the same values
// taken in double, for every length the vector loop and its tail meet and for
// a tensor split across threads; and refused (nullopt) wherever LibTorch's
// own norm must decide: a NaN or an infinity, norms a float sum may overflow,
// a tensor not read in place.
#include "nanscope/probe/host_norms.hpp"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

namespace nanscope::probe {
namespace {

double reference_square(const at::Tensor& t) { return t.to(at::kDouble).square().sum().item<double>(); }

TEST(HostNorms, EachSquaredNormIsTheDoubleSumOfItsSquares) {
  std::vector<at::Tensor> tensors;
  for (int64_t n = 0; n <= 19; ++n) tensors.push_back(at::randn({n}));
  tensors.push_back(at::randn({256, 28}));
  tensors.push_back(at::randn({3, 5, 7}) * 1e-20);  // tiny values: their squares are kept in double
  const std::optional<std::vector<double>> squares = squared_norms_on_host(tensors);
  ASSERT_TRUE(squares);
  ASSERT_EQ(squares->size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const double expected = reference_square(tensors[i]);
    EXPECT_NEAR((*squares)[i], expected, 1e-12 * expected) << "tensor " << i << " of " << tensors[i].numel();
  }
  EXPECT_GT(squares->back(), 0.0);  // a float sum of these squares would be 0
}

TEST(HostNorms, ATensorSplitAcrossThreadsSumsAllItsParts) {
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const at::Tensor large = at::randn({(int64_t(1) << 20) + 3});
  const std::optional<std::vector<double>> squares = squared_norms_on_host({large});
  at::set_num_threads(threads);
  ASSERT_TRUE(squares);
  const double expected = reference_square(large);
  EXPECT_NEAR(squares->front(), expected, 1e-12 * expected);
}

TEST(HostNorms, ANonFiniteValueAnywhereLeavesTheNormsToLibTorch) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const int64_t at : {int64_t(0), int64_t(7), int64_t(8), int64_t(20)}) {  // in the vector loop and its tail
      at::Tensor sick = at::randn({21});
      sick[at] = bad;
      EXPECT_FALSE(squared_norms_on_host({at::randn({4}), sick})) << bad << " at " << at;
    }
  }
}

TEST(HostNorms, NormsAFloatSumMayOverflowAreLeftToLibTorch) {
  // Finite values whose squares overflow float: LibTorch's float norm is inf there.
  EXPECT_FALSE(squared_norms_on_host({at::full({4}, 1e20f)}));
  EXPECT_FALSE(squared_norms_on_host({at::full({4}, 6e17f), at::full({4}, 6e17f)}));
  EXPECT_TRUE(squared_norms_on_host({at::full({4}, 1e15f)}));
}

TEST(HostNorms, TensorsNotReadInPlaceAreLeftToLibTorch) {
  EXPECT_FALSE(squared_norms_on_host({at::randn({4, 6}).t()}));                          // not contiguous
  EXPECT_FALSE(squared_norms_on_host({at::randn({8}).to(at::kBFloat16)}));               // 16-bit
  EXPECT_FALSE(squared_norms_on_host({at::randn({8}).to(at::kDouble)}));                 // double
  EXPECT_FALSE(squared_norms_on_host({at::randn({4}), at::randn({4, 4}).to_sparse()}));  // sparse
  EXPECT_TRUE(squared_norms_on_host({}));
}

}  // namespace
}  // namespace nanscope::probe
