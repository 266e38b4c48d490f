// What the skip-as-a-transaction costs a clean step: before each step the
// buffers a forward writes are copied (BufferTransaction), and after the
// forward they are checked for non-finite values with the step's one host
// read. Measured in one process, step by step alternating with the plain
// step, on two models:
//   resnet  a small residual CNN with 7 BatchNorm layers (every forward writes
//           21 buffers), 32 images of 3 x 32 x 32
//   masked  an MLP that reads one element of a 4 MB constant buffer (a causal
//           mask, as nanoGPT registers): after the first step nothing is copied
// Prints the median step with and without, their ratio, and the bytes copied per step.
// Usage: transaction_overhead [ROUNDS=7] [STEPS_PER_ROUND=20] [THREADS=2]
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench_args.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/core/buffer_transaction.hpp"
#include "nanscope/core/loss_scaler.hpp"
#include "nanscope/core/module_model.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/trainer/setup.hpp"

using namespace nanscope;
using namespace nanscope::trainer;

namespace {

struct ConvBn : torch::nn::Module {
  ConvBn(int64_t in, int64_t out, int64_t stride)
      : conv(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}
  at::Tensor forward(const at::Tensor& x) { return bn->forward(conv->forward(x)); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};

struct SmallResNet : torch::nn::Module {
  SmallResNet() {
    stem = register_module("stem", std::make_shared<ConvBn>(3, 32, 1));
    for (int i = 0; i < 2; ++i)
      block32.push_back(register_module("a" + std::to_string(i), std::make_shared<ConvBn>(32, 32, 1)));
    down = register_module("down", std::make_shared<ConvBn>(32, 64, 2));
    for (int i = 0; i < 3; ++i)
      block64.push_back(register_module("b" + std::to_string(i), std::make_shared<ConvBn>(64, 64, 1)));
    fc = register_module("fc", torch::nn::Linear(64, 10));
  }
  at::Tensor forward(const at::Tensor& images) {
    at::Tensor x = at::relu(stem->forward(images));
    x = at::relu(x + block32[1]->forward(at::relu(block32[0]->forward(x))));
    x = at::relu(down->forward(x));
    for (auto& b : block64) x = at::relu(x + b->forward(x));
    return fc->forward(x.mean({2, 3}));
  }
  std::shared_ptr<ConvBn> stem, down;
  std::vector<std::shared_ptr<ConvBn>> block32, block64;
  torch::nn::Linear fc{nullptr};
};

struct MaskedMlp : torch::nn::Module {
  MaskedMlp() {
    l1 = register_module("l1", torch::nn::Linear(256, 512));
    l2 = register_module("l2", torch::nn::Linear(512, 10));
    mask = register_buffer("mask", at::ones({1024, 1024}));
  }
  at::Tensor forward(const at::Tensor& x) { return l2->forward(at::relu(l1->forward(x))) * mask[0][0]; }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
  at::Tensor mask;
};

struct Arm {
  std::unique_ptr<ModuleModel> model;
  std::vector<at::Tensor> parameters;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  LossScaler scaler;
  BufferTransaction transaction;
  at::Tensor inputs, targets;
  std::vector<double> plain, guarded;
  int64_t copied_bytes = 0;

  double step(bool with_transaction) {
    const auto start = std::chrono::steady_clock::now();
    StepSettings settings;
    if (with_transaction) {
      transaction.begin(*model);
      settings.written_buffers = &transaction.written_floating();
    }
    const StepOutcome out = train_step(*model, *optimizer, scaler, parameters, settings, Batch(inputs, targets));
    if (with_transaction) {
      if (out.skipped)
        transaction.roll_back();
      else
        transaction.commit();
      copied_bytes = transaction.copied_bytes();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

template <typename Net>
Arm make_arm(std::shared_ptr<Net> net, at::Tensor inputs, at::Tensor targets) {
  Arm arm;
  arm.model = std::make_unique<ModuleModel>("bench", net, [net](const at::Tensor& x, const at::Tensor& y) {
    return torch::nn::functional::cross_entropy(net->forward(x), y);
  });
  arm.model->set_training(true);
  arm.parameters = trainable_tensors(*arm.model);
  arm.optimizer = std::make_unique<torch::optim::AdamW>(arm.parameters, torch::optim::AdamWOptions(1e-3));
  arm.inputs = std::move(inputs);
  arm.targets = std::move(targets);
  return arm;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "transaction_overhead [ROUNDS=7] [STEPS_PER_ROUND=20] [THREADS=2]");
  const int rounds = int(args.count(1, 7));
  const int steps = int(args.count(2, 20));
  const int threads = int(args.count(3, 2));
  TrainOptions runtime;
  runtime.threads = threads;
  configure_runtime(runtime, at::kCPU);
  at::manual_seed(0);
  std::vector<std::pair<const char*, Arm>> arms;
  arms.emplace_back("resnet",
                    make_arm(std::make_shared<SmallResNet>(), at::randn({32, 3, 32, 32}), at::randint(0, 10, {32})));
  arms.emplace_back("masked", make_arm(std::make_shared<MaskedMlp>(), at::randn({64, 256}), at::randint(0, 10, {64})));
  for (auto& [name, arm] : arms)
    for (int i = 0; i < 3; ++i) arm.step(i % 2 == 0);  // warm-up; the transaction learns on its first commit
  for (int r = 0; r < rounds; ++r)
    for (auto& [name, arm] : arms)
      for (int s = 0; s < steps; ++s) {
        arm.plain.push_back(arm.step(false));
        arm.guarded.push_back(arm.step(true));
      }
  std::printf("transaction_overhead: %d rounds x %d steps, alternating, %d threads (LibTorch %s)\n", rounds, steps,
              threads, TORCH_VERSION);
  for (auto& [name, arm] : arms) {
    const double plain = median(arm.plain), guarded = median(arm.guarded);
    std::printf(
        "  %-7s plain %8.3f ms  with transaction %8.3f ms  ratio %.3f  (%lld bytes copied per step, %zu buffers)\n",
        name, plain * 1e3, guarded * 1e3, guarded / plain, static_cast<long long>(arm.copied_bytes),
        arm.transaction.copied_names().size());
  }
  return 0;
}
