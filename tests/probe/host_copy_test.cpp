// The guard's own copies: every layout and type comes out equal to its
// source, byte for byte where the two lie alike and through copy_ otherwise.
#include "nanscope/probe/host_copy.hpp"

#include <gtest/gtest.h>

namespace nanscope::probe {
namespace {

at::Tensor like(const at::Tensor& t) { return at::empty_strided(t.sizes(), t.strides(), t.options()); }

TEST(HostCopy, EachLayoutAndTypeComesOutEqualToItsSource) {
  const at::Tensor images = at::rand({8, 3, 5, 5});
  const std::vector<at::Tensor> sources = {
      images,
      at::randint(0, 10, {8}, at::kLong),
      images.to(at::kBFloat16),
      images.contiguous(at::MemoryFormat::ChannelsLast),
      at::rand({10, 4}).narrow(0, 3, 5),  // an offset into its storage
      at::empty({0, 3}),
  };
  for (const at::Tensor& src : sources) {
    const at::Tensor dst = like(src);
    copy_into(dst, src);
    EXPECT_TRUE(at::equal(dst, src)) << src.sizes() << " " << src.strides();
  }
}

// Copies from 64 KB on are streamed in 64-byte strides from a 16-byte
// aligned destination: every misalignment of either end, and tails of every
// kind, come out equal, with not a byte written outside the destination.
TEST(HostCopy, LargeCopiesAtEveryAlignmentComeOutEqualAndStayInside) {
  for (const int64_t bytes :
       {int64_t(64 * 1024), int64_t(64 * 1024 + 1), int64_t(64 * 1024 + 63), int64_t(200 * 1024 + 81)}) {
    const at::Tensor source = at::randint(0, 256, {bytes + 16}, at::kByte);
    for (int64_t src_at : {0, 1, 7})
      for (int64_t dst_at = 0; dst_at < 16; ++dst_at) {
        const at::Tensor outside = at::full({bytes + 32}, 0xAB, at::kByte);
        const at::Tensor area = outside.clone();
        const at::Tensor src = source.narrow(0, src_at, bytes);
        const at::Tensor dst = area.narrow(0, dst_at, bytes);
        copy_into(dst, src);
        ASSERT_TRUE(at::equal(dst, src)) << bytes << " bytes, source at +" << src_at << ", destination at +" << dst_at;
        ASSERT_TRUE(at::equal(area.narrow(0, 0, dst_at), outside.narrow(0, 0, dst_at)));
        ASSERT_TRUE(at::equal(area.narrow(0, dst_at + bytes, 32 - dst_at), outside.narrow(0, 0, 32 - dst_at)));
      }
  }
  const at::Tensor images = at::rand({64, 1, 28, 28});  // a micro-batch as the guard keeps it
  const at::Tensor kept = like(images);
  copy_into(kept, images);
  EXPECT_TRUE(at::equal(kept, images));
}

TEST(HostCopy, TensorsLaidOutApartAreCopiedByCopy) {
  const at::Tensor wide = at::rand({4, 6});
  const std::vector<std::pair<at::Tensor, at::Tensor>> pairs = {
      {at::empty({6, 4}), wide.t()},                      // strides differ
      {at::empty({3, 5}), at::rand({5}).expand({3, 5})},  // a stride of 0
      {at::empty({4, 6}, at::kDouble), wide},             // types differ
  };
  for (const auto& [dst, src] : pairs) {
    copy_into(dst, src);
    EXPECT_TRUE(at::allclose(dst, src.to(dst.scalar_type()))) << src.sizes() << " " << src.strides();
  }
}

TEST(HostCopy, ACopyAsBytesLeavesTheVersionCounterAlone) {
  const at::Tensor src = at::rand({64});
  const at::Tensor dst = like(src);
  const auto before = dst._version();
  copy_into(dst, src);
  EXPECT_EQ(dst._version(), before);
  EXPECT_TRUE(at::equal(dst, src));
}

}  // namespace
}  // namespace nanscope::probe
