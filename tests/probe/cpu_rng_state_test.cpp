// A micro-batch's CPU generator state: kept by value without get_state(),
// it must put the generator back exactly where it stood, and say get_state()'s
// own bytes for a snapshot.
#include "nanscope/probe/cpu_rng_state.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace nanscope {
namespace {

at::Tensor generator_bytes() { return at::detail::getDefaultCPUGenerator().get_state(); }

// Draws that use both the engine and the cached normal sample (randn draws pairs).
at::Tensor draws() { return at::cat({at::rand({5}), at::randn({3}), at::randn({1}, at::kDouble).to(at::kFloat)}); }

TEST(CpuRngState, PutsTheGeneratorBackToDrawTheSameNumbersAgain) {
  at::manual_seed(7);
  static_cast<void>(at::randn({1}));  // an odd number of normals: a cached sample is part of the state
  const CpuRngState state = CpuRngState::now();
  const at::Tensor bytes_then = generator_bytes();
  const at::Tensor first = draws();
  EXPECT_FALSE(state.is_current());
  state.restore();
  EXPECT_TRUE(state.is_current());
  EXPECT_TRUE(at::equal(generator_bytes(), bytes_then));
  EXPECT_TRUE(at::equal(draws(), first));
}

TEST(CpuRngState, SaysGetStatesBytesAndIsReadBackFromThem) {
  at::manual_seed(11);
  static_cast<void>(at::randn({3}));
  const at::Tensor bytes_then = generator_bytes();
  const CpuRngState state = CpuRngState::now();
  const at::Tensor first = draws();
  EXPECT_TRUE(at::equal(state.bytes(), bytes_then));

  const CpuRngState read = CpuRngState::from_bytes(bytes_then);
  EXPECT_FALSE(read.is_current());  // reading the bytes moved nothing: the generator is past them
  read.restore();
  EXPECT_TRUE(at::equal(draws(), first));
}

TEST(CpuRngState, NoneKnownLeavesTheGeneratorAsItIs) {
  const CpuRngState none;
  const CpuRngState from_nothing = CpuRngState::from_bytes(at::Tensor());
  EXPECT_FALSE(none.known());
  EXPECT_FALSE(from_nothing.known());
  const at::Tensor before = generator_bytes();
  none.restore();
  EXPECT_TRUE(at::equal(generator_bytes(), before));
  EXPECT_FALSE(none.bytes().defined());
  EXPECT_FALSE(none.is_current());
  EXPECT_EQ(none.size_bytes(), 0);
}

TEST(CpuRngState, TakingItAgainLeavesEveryCopyWhereItWasTaken) {
  at::manual_seed(3);
  CpuRngState step_state;
  step_state.take_now();
  const CpuRngState kept = step_state;  // a failed step's micro-batch keeps its state
  const at::Tensor kept_bytes = generator_bytes();
  static_cast<void>(draws());
  step_state.take_now();  // the next step's
  EXPECT_TRUE(step_state.is_current());
  EXPECT_TRUE(at::equal(kept.bytes(), kept_bytes));
  EXPECT_FALSE(at::equal(step_state.bytes(), kept_bytes));
}

TEST(CpuRngState, BadBytesAreRefusedWithTheGeneratorsOwnError) {
  EXPECT_THROW(CpuRngState::from_bytes(at::zeros({7}, at::kByte)), c10::Error);
}

}  // namespace
}  // namespace nanscope
