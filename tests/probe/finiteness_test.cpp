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

}  // namespace
}  // namespace nanscope::probe
