// The finiteness checks of batches, written buffers and the training state:
// each kind of non-finite value, in each floating type, found in the tensor
// that holds it and nowhere else.
#include "nanscope/probe/finiteness.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace nanscope::probe {
namespace {

std::vector<bool> flags(const at::Tensor& finite) {
  std::vector<bool> out;
  for (int64_t i = 0; i < finite.numel(); ++i) out.push_back(finite[i].item<bool>());
  return out;
}

TEST(Finiteness, EachNonFiniteValueInEachFloatingTypeIsFoundInItsTensor) {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    for (const double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
      at::Tensor sick = at::rand({3, 5}).to(dtype);
      sick[2][4] = bad;
      const std::vector<at::Tensor> tensors = {at::rand({7}).to(dtype), sick, at::zeros({2, 2}).to(dtype)};
      EXPECT_EQ(flags(finite_each(tensors)), (std::vector<bool>{true, false, true}))
          << at::toString(dtype) << " " << bad;
      EXPECT_EQ(any_nonfinite(tensors).item<float>(), 1.0f) << at::toString(dtype) << " " << bad;
      EXPECT_EQ(any_nonfinite({tensors[0], tensors[2]}).item<float>(), 0.0f) << at::toString(dtype);
    }
  }
}

TEST(Finiteness, EmptyAndIntegerTensorsAreFiniteAndKeepTheirPlaces) {
  at::Tensor sick = at::ones({4});
  sick[1] = NAN;
  const std::vector<at::Tensor> tensors = {at::empty({0}), sick, at::arange(5), at::empty({3, 0}), at::ones({1})};
  EXPECT_EQ(flags(finite_each(tensors)), (std::vector<bool>{true, false, true, true, true}));
  EXPECT_EQ(flags(finite_each({at::empty({0})})), std::vector<bool>{true});
  EXPECT_EQ(finite_each({}).numel(), 0);
  EXPECT_EQ(any_nonfinite({}).item<float>(), 0.0f);
  // Finite values as large as the type holds are finite: nothing is summed.
  EXPECT_EQ(any_nonfinite({at::full({1000}, 65504.0, at::kHalf)}).item<float>(), 0.0f);
}

TEST(Finiteness, ViewsAndLargeTensorsAreReadWhereTheValuesLie) {
  // A large tensor is read in parallel pieces: the NaN in its last piece is found.
  at::Tensor large = at::zeros({3 << 19});
  EXPECT_EQ(any_nonfinite({large}).item<float>(), 0.0f);
  large[large.numel() - 1] = NAN;
  EXPECT_EQ(any_nonfinite({large}).item<float>(), 1.0f);
  // A view past the storage's start, a transposed (strided) one, a negated one:
  // each is read as its values, not as its storage.
  at::Tensor sick = at::ones({4, 6});
  sick[0][5] = INFINITY;
  EXPECT_EQ(any_nonfinite({sick.narrow(0, 1, 3)}).item<float>(), 0.0f);
  EXPECT_EQ(any_nonfinite({sick.narrow(1, 5, 1)}).item<float>(), 1.0f);
  EXPECT_EQ(flags(finite_each({sick.t(), sick.narrow(0, 2, 2).t()})), (std::vector<bool>{false, true}));
  EXPECT_EQ(any_nonfinite({sick.neg()}).item<float>(), 1.0f);
  // Mixed types in one call: the integer tensor is finite, the bf16 one is not.
  at::Tensor bf16 = at::ones({5}, at::kBFloat16);
  bf16[2] = -INFINITY;
  EXPECT_EQ(flags(finite_each({at::arange(3), bf16, at::ones({2}, at::kDouble)})),
            (std::vector<bool>{true, false, true}));
}

TEST(Finiteness, TheLargestMagnitudeIsTheKernelsInEveryFloatingType) {
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const at::Tensor values = (at::randn({7, 9}) * 100).to(dtype);
    const float kernel = values.abs().max().to(at::kFloat).item<float>();
    EXPECT_EQ(abs_max(values).item<float>(), kernel) << at::toString(dtype);
    EXPECT_EQ(abs_max(values.t()).item<float>(), kernel) << at::toString(dtype) << " strided";
    at::Tensor sick = values.clone();
    sick[3][1] = -INFINITY;
    EXPECT_EQ(abs_max(sick).item<float>(), INFINITY) << at::toString(dtype);
    sick[5][2] = NAN;
    EXPECT_TRUE(std::isnan(abs_max(sick).item<float>())) << at::toString(dtype);
  }
  EXPECT_EQ(abs_max(at::full({3}, -0.0)).item<float>(), 0.0f);
}

}  // namespace
}  // namespace nanscope::probe
