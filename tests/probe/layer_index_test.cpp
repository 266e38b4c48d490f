// Per-layer grad norms: parameters grouped by the module that owns them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nanscope/probe/layer_index.hpp"

using namespace nanscope;

TEST(LayerIndex, GroupsParametersByOwningModule) {
  probe::LayerIndex index({"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "head.weight", "scale"});
  EXPECT_EQ(index.layer_names(), (std::vector<std::string>{"blocks.0.attn.qkv", "head", ""}));
  const float norms[] = {3, 4, 2, std::numeric_limits<float>::infinity()};
  auto layers = index.fold_norms(norms);
  EXPECT_FLOAT_EQ(layers[0], 5.0f);
  EXPECT_FLOAT_EQ(layers[1], 2.0f);
  EXPECT_TRUE(std::isinf(layers[2]));
}
