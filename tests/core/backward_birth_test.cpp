// Backward births in the C++ library: a NaN made in the backward of a
// torch::autograd::Function<T> of the user's model, or in an aten op's
// derivative, is named by the module whose forward made the node and by the
// batch row, in the closure and the watched forms, without module scopes.
#include <gtest/gtest.h>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <sstream>

#include "../support/test_support.hpp"
#include "nanscope/nanscope.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

// A fused norm's gain with a hand-written backward that divides each
// sample's gradient by its largest input: 0 for an all-zero sample.
struct GradPoison : torch::autograd::Function<GradPoison> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gain) {
    ctx->save_for_backward({x, gain});
    return x * gain;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &gain = saved[1];
    return {grad[0] * gain / x.abs().amax({1}, true), (grad[0] * x).sum(0)};
  }
};

namespace backward_births {

enum class Sick { function, derivative };

// llama2.c's RMSNorm with a gain, and a learnt eps that starts at 0: sqrt's
// derivative divides by a zero norm for an all-zero sample; or GradPoison's
// gain alone. Without module scopes, the ops reading the weights name the module.
struct Norm : torch::nn::Module {
  explicit Norm(Sick how) : how(how) {}
  at::Tensor forward(const at::Tensor& x) {
    if (how == Sick::function) return GradPoison::apply(x, weight);
    const at::Tensor rms = (x.pow(2).mean(1, true) + eps).sqrt();
    return x / (rms + 1e-3) * weight;
  }
  Sick how;
  at::Tensor weight = register_parameter("weight", torch::ones({8}));
  at::Tensor eps = register_parameter("eps", torch::zeros({1}));
};

struct Block : torch::nn::Module {
  explicit Block(Sick how) : norm(register_module("norm", std::make_shared<Norm>(how))) {}
  at::Tensor forward(const at::Tensor& x) { return norm->forward(lin->forward(x)); }
  torch::nn::Linear lin{register_module("lin", torch::nn::Linear(8, 8))};
  std::shared_ptr<Norm> norm;
};

// blocks.0 and blocks.1 keep an all-zero sample at zero: blocks.1.norm is the
// first, in backward order, to divide by it.
struct Net : torch::nn::Module {
  explicit Net(Sick how) {
    blocks = register_module("blocks", torch::nn::ModuleList(std::make_shared<Block>(how), std::make_shared<Block>(how),
                                                             std::make_shared<Block>(how)));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < 2; ++i) blocks[i]->as<Block>()->lin->bias.zero_();
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (size_t i = 0; i < blocks->size(); ++i) h = blocks[i]->as<Block>()->forward(h);
    return h.sum(1).mean();
  }
  torch::nn::ModuleList blocks{nullptr};
};

at::Tensor batch_with_zero_row(int64_t row) {
  at::Tensor x = torch::randn({4, 8});
  x[row].zero_();
  return x;
}

// A quiet fp32 guard without fallback over a fresh Net (seeded), stepping SGD.
struct Guarded {
  explicit Guarded(Sick how) : net((torch::manual_seed(0), how)) {}
  GuardOptions options() const {
    GuardOptions o{dir.file("run"), Amp::fp32};
    o.log = nullptr;
    o.fallback = FallbackMode::off;
    return o;
  }
  // One closure step on `x`.
  GuardedStep step(const at::Tensor& x) {
    return guard.closure_step([&] { return net.forward(x); }, {x, torch::zeros({x.size(0)})});
  }
  TempDir dir;
  Net net;
  torch::optim::SGD optimizer{net.parameters(), 0.1};
  StepGuard guard{net, optimizer, options()};
};

}  // namespace backward_births

using namespace backward_births;

TEST(BackwardBirth, ACustomFunctionsBackwardIsNamedByItsModuleFunctionAndRow) {
  Guarded g(Sick::function);
  const GuardedStep r = g.step(batch_with_zero_row(2));
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.first_birth,
            "inf at aten::div (backward, in torch::autograd::CppNode<GradPoison> of GradPoison) in module "
            "'blocks.1.norm', batch row 2");
}

TEST(BackwardBirth, AnAtenDerivativesBirthNamesItsRow) {
  Guarded g(Sick::derivative);
  const GuardedStep r = g.step(batch_with_zero_row(1));
  EXPECT_FALSE(r.counted());
  // sqrt's derivative is grad / (2 sqrt(0)): the gradient reaching it decides NaN or Inf.
  EXPECT_NE(r.first_birth.find(" at aten::div (backward, in SqrtBackward0 of aten::sqrt) in module 'blocks.1.norm', "
                               "batch row 1"),
            std::string::npos)
      << r.first_birth;
}

TEST(BackwardBirth, TheWatchedFormNamesTheMicroBatchOfABackwardBirth) {
  Guarded g(Sick::function);
  g.guard.set_loss_fn([&](const Batch& b) { return g.net.forward(b.inputs); });
  for (int micro = 0; micro < 2; ++micro) {
    const at::Tensor x = micro == 1 ? batch_with_zero_row(3) : torch::randn({4, 8});
    g.guard.backward(g.net.forward(x) / 2.0, {x, torch::zeros({4})});
  }
  const GuardedStep r = g.guard.step();
  EXPECT_FALSE(r.counted());
  EXPECT_NE(r.first_birth.find("(backward, in torch::autograd::CppNode<GradPoison> of GradPoison) in module "
                               "'blocks.1.norm', micro-batch 1, batch row 3"),
            std::string::npos)
      << r.first_birth;
}
