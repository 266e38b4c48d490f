// BufferTransaction copies only the buffers a forward writes, learns a late write, and puts them back.
#include <gtest/gtest.h>

#include <torch/nn/module.h>

#include <memory>

#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/module_model.hpp"

using namespace nanscope;

TEST(BufferTransaction, CopiesOnlyWhatAForwardWritesAndLearnsLateWrites) {
  // A model with a constant mask and a counter its forward bumps.
  struct Counting : torch::nn::Module {
    Counting() {
      weight = register_parameter("weight", at::ones({4}));
      mask = register_buffer("mask", at::ones({256, 256}));
      count = register_buffer("count", at::zeros({1}));
      late = register_buffer("late", at::zeros({1}));
    }
    at::Tensor weight, mask, count, late;
  };
  auto net = std::make_shared<Counting>();
  bool write_late = false;
  ModuleModel model("counting", net, [&](const at::Tensor& x, const at::Tensor&) {
    net->count.add_(1);
    if (write_late) net->late.add_(1);
    return (x * net->weight).sum() * net->mask[0][0];
  });
  BufferTransaction transaction;
  transaction.begin(model);
  EXPECT_EQ(transaction.copied_names().size(), 3u) << "before any step counted, every buffer is copied";
  model.loss(at::ones({4}), {});
  transaction.commit();
  EXPECT_EQ(transaction.copied_names(), std::vector<std::string>{"count"});
  EXPECT_EQ(transaction.copied_bytes(), int64_t(sizeof(float)));

  transaction.begin(model);
  write_late = true;
  model.loss(at::ones({4}), {});
  std::vector<std::string> missed;
  EXPECT_EQ(transaction.roll_back(&missed), std::vector<std::string>{"count"});
  EXPECT_EQ(missed, std::vector<std::string>{"late"});
  EXPECT_EQ(net->count.item<float>(), 1.0f);
  transaction.begin(model);
  EXPECT_EQ(transaction.copied_names(), (std::vector<std::string>{"count", "late"}));
}
