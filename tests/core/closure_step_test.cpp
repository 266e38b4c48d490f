// The closure step: a plain torch::nn::Module and the user's own forward and
// loss, with modules named from named_modules() and no edit to forward.
#include <gtest/gtest.h>

#include <optional>

#include <ATen/record_function.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <limits>
#include <sstream>

#include "../support/test_support.hpp"
#include "nanscope/core/step_guard_harness.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/nanscope.hpp"
#include "nanscope/probe/snapshot.hpp"

using namespace nanscope;
using nanscope::test::TempDir;

namespace {

// Two linears in a block: an op between them belongs to the block.
struct Block : torch::nn::Module {
  Block() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(8, 8));
  }
  // log of the first linear's output: NaN where it is negative, only when asked.
  at::Tensor forward(const at::Tensor& x, bool poison) {
    at::Tensor h = a->forward(x);
    if (poison) h = torch::log(h);
    return b->forward(h);
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// Containers of every kind, no module scopes anywhere.
struct Nested : torch::nn::Module {
  Nested() {
    stem = register_module("stem", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU()));
    blocks = register_module("blocks", torch::nn::ModuleList(std::make_shared<Block>(), std::make_shared<Block>()));
    heads = register_module("heads",
                            torch::nn::ModuleDict(torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>{
                                {"out", std::make_shared<torch::nn::LinearImpl>(8, 1)}}));
  }
  at::Tensor forward(const at::Tensor& x, int64_t poisoned_block = -1) {
    at::Tensor h = stem->forward(x);
    for (size_t i = 0; i < blocks->size(); ++i) h = blocks[i]->as<Block>()->forward(h, int64_t(i) == poisoned_block);
    return heads["out"]->as<torch::nn::Linear>()->forward(h);
  }
  torch::nn::Sequential stem{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::ModuleDict heads{nullptr};
};

// nanoGPT's shape in C++: blocks that read a causal-mask buffer on every
// forward, then the loss in the root's own forward.
struct MaskedBlock : torch::nn::Module {
  MaskedBlock() {
    proj = register_module("proj", torch::nn::Linear(8, 8));
    mask = register_buffer("mask", torch::ones({8, 8}).tril());
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor scores = torch::matmul(x.unsqueeze(2), x.unsqueeze(1)).masked_fill(mask == 0, -INFINITY);
    return x + proj->forward(torch::softmax(scores, -1).matmul(x.unsqueeze(2)).squeeze(2));
  }
  torch::nn::Linear proj{nullptr};
  at::Tensor mask;
};

struct MaskedNet : torch::nn::Module {
  MaskedNet() {
    blocks = register_module("blocks",
                             torch::nn::ModuleList(std::make_shared<MaskedBlock>(), std::make_shared<MaskedBlock>()));
  }
  // The loss, with ignore_index, in the root's own forward right after the
  // last block (its 8 outputs are the logits): all targets ignored is 0 / 0.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& targets) {
    at::Tensor h = x;
    for (size_t i = 0; i < blocks->size(); ++i) h = blocks[i]->as<MaskedBlock>()->forward(h);
    return at::cross_entropy_loss(h, targets, {}, at::Reduction::Mean, /*ignore_index=*/-1);
  }
  torch::nn::ModuleList blocks{nullptr};
};

GuardOptions quiet(const std::string& run_dir, std::ostream& log) {
  GuardOptions o{run_dir, Amp::bf16};
  o.log = &log;
  return o;
}

}  // namespace

TEST(ClosureStep, NamesTheModuleFromNamedModulesWithoutScopes) {
  TempDir dir;
  torch::manual_seed(0);
  Nested net;  // on the stack: the guard keeps a reference
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::randn({16, 4}), y = torch::randn({16, 1});
  for (int64_t step = 0; step < 4; ++step) {
    const int64_t poisoned = step == 2 ? 1 : -1;  // log of a linear's output inside blocks.1
    GuardedStep r = guard.closure_step([&] { return torch::mse_loss(net.forward(x, poisoned), y); }, {x, y});
    EXPECT_EQ(r.counted(), step != 2) << step;
    if (step == 2) {
      // The batch rows it names, if not all of them, follow from the signs the linear gives.
      EXPECT_EQ(r.first_birth.rfind("nan at aten::log (forward) in module 'blocks.1'", 0), 0u) << log.str();
      EXPECT_FALSE(r.snapshot.empty());
    }
  }
  EXPECT_EQ(StepGuardHarness(guard).next_step(), 4);
}

TEST(ClosureStep, AnOpReadingAModulesParameterBelongsToIt) {
  TempDir dir;
  torch::manual_seed(0);
  Nested net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  // The first linear's weight made huge: its matmul of positive inputs overflows, in module stem.0.
  {
    torch::NoGradGuard no_grad;
    net.stem[0]->as<torch::nn::Linear>()->weight.fill_(3e38f);
  }
  const at::Tensor x = torch::rand({8, 4}) + 1, y = torch::randn({8, 1});
  GuardedStep r = guard.closure_step([&] { return torch::mse_loss(net.forward(x), y); }, {x, y});
  EXPECT_FALSE(r.counted());
  EXPECT_NE(r.first_birth.find("in module 'stem.0'"), std::string::npos) << r.first_birth;
}

TEST(ClosureStep, LibraryDefaultsAddNothingTheLoopDidNotDo) {
  const GuardOptions defaults;
  EXPECT_LE(defaults.clip, 0) << "the library does not clip unless asked";
  EXPECT_EQ(defaults.log, &std::cerr);

  TempDir dir;
  torch::manual_seed(0);
  auto guarded = torch::nn::Linear(4, 1), plain = torch::nn::Linear(4, 1);
  {
    torch::NoGradGuard no_grad;
    plain->weight.copy_(guarded->weight);
    plain->bias.copy_(guarded->bias);
  }
  const at::Tensor x = torch::randn({8, 4}) * 100, y = torch::randn({8, 1}) * 100;  // a gradient far above 1
  torch::optim::SGD a(guarded->parameters(), 0.001), b(plain->parameters(), 0.001);
  GuardOptions o{dir.file("run")};
  o.log = nullptr;
  StepGuard guard(guarded, a, o);
  guard.closure_step([&] { return torch::mse_loss(guarded->forward(x), y); }, {x, y});
  b.zero_grad();
  torch::mse_loss(plain->forward(x), y).backward();
  EXPECT_GT(plain->weight.grad().norm().item<double>(), 10);
  b.step();
  EXPECT_TRUE(torch::allclose(guarded->weight, plain->weight)) << "the step equals the plain loop's, unclipped";
}

TEST(ClosureStep, AScopeNameThatIsNoModuleIsAWarning) {
  TempDir dir;
  struct Scoped : torch::nn::Module {
    Scoped() { fc = register_module("fc", torch::nn::Linear(4, 1)); }
    at::Tensor forward(const at::Tensor& x) {
      NANSCOPE_MODULE_SCOPE("fcc");  // misspelt
      return fc->forward(x);
    }
    torch::nn::Linear fc{nullptr};
  };
  Scoped net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::randn({4, 4}), y = torch::randn({4, 1});
  for (int i = 0; i < 3; ++i) guard.closure_step([&] { return torch::mse_loss(net.forward(x), y); }, {x, y});
  const std::string text = log.str();
  EXPECT_NE(text.find("NANSCOPE_MODULE_SCOPE(\"fcc\") names no module"), std::string::npos) << text;
  EXPECT_EQ(text.find("names no module"), text.rfind("names no module")) << "said once: " << text;
}

TEST(ClosureStep, RowsAreUnknownWithoutBatchRowsAndTheBirthNamesItsRow) {
  TempDir dir;
  torch::manual_seed(0);
  // Dropout draws random numbers, so the batch cannot be bisected; the birth's
  // own output says which row went non-finite: a log of a blank row's std.
  struct Normalizing : torch::nn::Module {
    Normalizing() {
      fc = register_module("fc", torch::nn::Linear(6, 1));
      drop = register_module("drop", torch::nn::Dropout(0.5));
    }
    at::Tensor forward(const at::Tensor& x) {
      at::Tensor scale = torch::log(x.std(1, true, true));
      return fc->forward(drop->forward(x - scale));
    }
    torch::nn::Linear fc{nullptr};
    torch::nn::Dropout drop{nullptr};
  };
  Normalizing net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  at::Tensor x = torch::rand({8, 6});
  x[5].fill_(0.25);  // a blank sample: std 0, log -inf
  const at::Tensor y = torch::randn({8, 1});
  GuardedStep r = guard.closure_step([&] { return torch::mse_loss(net.forward(x), y); }, {x, y});
  ASSERT_FALSE(r.counted());
  ASSERT_FALSE(r.snapshot.empty()) << log.str();
  const probe::SnapshotContents s = probe::read_snapshot(r.snapshot);
  ASSERT_TRUE(s.capture.first_birth);
  EXPECT_EQ(s.capture.first_birth->op.op, "aten::log");
  EXPECT_EQ(s.capture.first_birth->rows, std::vector<int64_t>{5});
  EXPECT_EQ(s.origin, format::Origin::cpp);
  EXPECT_TRUE(at::equal(s.batch_rows, at::full({8}, -1, at::kLong))) << "no rows given: unknown, not 0..7";

  // With the data set rows given, the snapshot carries them.
  StepContext context;
  context.batch_rows = at::arange(100, 108, at::kLong);
  GuardedStep again = guard.closure_step([&] { return torch::mse_loss(net.forward(x), y); }, {x, y}, context);
  EXPECT_FALSE(again.counted());
}

TEST(ClosureStep, AClosureThatTakesTheBatchLetsTheFallbackFindTheSample) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  GuardOptions o = quiet(dir.file("run"), log);
  o.fallback = FallbackMode::automatic;
  StepGuard guard(net, optimizer, o);
  at::Tensor x = torch::rand({8, 4}) + 0.5;
  x[3][2] = -1;  // log of a negative: NaN in one sample, inside the model's forward
  const at::Tensor y = torch::randn({8, 1});
  BatchLoss loss = [&](const Batch& b) { return torch::mse_loss(net->forward(torch::log(b.inputs)), b.targets); };
  GuardedStep r = guard.closure_step(loss, {x, y});
  EXPECT_FALSE(r.counted());
  // An ordinary sample (-1 beside values in [0.5, 1.5]) that the model's own
  // log cannot take: the op's trigger, not a data fault.
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log.str();
  EXPECT_NE(log.str().find("finite without batch row 3, an ordinary sample"), std::string::npos) << log.str();
  EXPECT_EQ(guard.amp(), Amp::bf16) << "non-finite at fp32 too: precision is not the cause";
}

TEST(ClosureStep, AGuardOfATrainableModelRefusesAClosureStep) {
  TempDir dir;
  auto net = std::make_shared<torch::nn::LinearImpl>(4, 1);
  ModuleModel model("linear", net,
                    [net](const at::Tensor& x, const at::Tensor& y) { return torch::mse_loss(net->forward(x), y); });
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  GuardOptions o{dir.file("run")};
  o.log = nullptr;
  StepGuard guard(model, optimizer, o);
  const at::Tensor x = torch::randn({4, 4}), y = torch::randn({4, 1});
  EXPECT_THROW(guard.closure_step([&] { return torch::mse_loss(net->forward(x), y); }, {x, y}), std::logic_error);
  EXPECT_TRUE(guard.closure_step(x, y, StepContext::numbered(0)).counted());
}

// The forensic re-run keeps and restores the model's buffers around itself;
// those copies are nanscope's, not the model's, and must not name a module
// (they did: the root's loss became 'blocks', the common parent of the first
// and last buffer copied).
TEST(ClosureStep, ALossInTheRootsForwardAfterBlocksThatReadBuffersIsTheRoots) {
  TempDir dir;
  torch::manual_seed(0);
  MaskedNet net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::randn({16, 8});
  for (int64_t step = 0; step < 3; ++step) {
    const at::Tensor targets = step == 1 ? torch::full({16}, -1, at::kLong) : torch::randint(0, 8, {16});
    GuardedStep r = guard.closure_step([&] { return net.forward(x, targets); }, {x, targets});
    EXPECT_EQ(r.counted(), step != 1) << step;
    if (step == 1) {
      EXPECT_EQ(r.first_birth.rfind("nan at aten::", 0), 0u) << r.first_birth;
      EXPECT_NE(r.first_birth.find("in module ''"), std::string::npos) << r.first_birth;
    }
  }
  EXPECT_EQ(guard.amp(), Amp::bf16) << "a data fault is skipped, not punished with fp32 (FallbackMode::automatic)\n"
                                    << log.str();
}

// A buffer may hold infinities on purpose: an additive -inf mask, a running
// maximum that starts at -inf and is only partly filled. Neither is a
// non-finite step nor a sick state; a step that writes a new infinity into a
// buffer still does not count, and the buffer is put back.
TEST(ClosureStep, ABuffersOwnInfinitiesAreNoNonFiniteStepButANewOneIs) {
  struct WithInfinities : torch::nn::Module {
    WithInfinities() {
      fc = register_module("fc", torch::nn::Linear(4, 1));
      mask = register_buffer("mask", torch::full({4, 4}, -INFINITY).triu(1));
      running_max = register_buffer("running_max", torch::full({4}, -INFINITY));
      stat = register_buffer("stat", torch::zeros({1}));
    }
    at::Tensor forward(const at::Tensor& x, bool poison) {
      {
        torch::NoGradGuard no_grad;
        at::Tensor seen = running_max.slice(0, 0, 2);  // the last two stay -inf
        seen.copy_(torch::maximum(seen, std::get<0>(x.max(0)).slice(0, 0, 2)));
        stat.add_(poison ? INFINITY : 1.0);  // not read by the loss: only the buffer check sees it
      }
      return fc->forward(torch::softmax(x.unsqueeze(1) + mask, -1).sum(1));
    }
    torch::nn::Linear fc{nullptr};
    at::Tensor mask, running_max, stat;
  };
  TempDir dir;
  torch::manual_seed(0);
  WithInfinities net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  EXPECT_TRUE(guard.health().finite()) << guard.health().text();
  const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
  for (int64_t step = 0; step < 4; ++step) {
    GuardedStep r = guard.closure_step([&] { return torch::mse_loss(net.forward(x, step == 2), y); }, {x, y});
    EXPECT_EQ(r.counted(), step != 2) << step << "\n" << log.str();
    if (step == 2) {
      EXPECT_NE(std::find(r.restored.begin(), r.restored.end(), "stat"), r.restored.end());
    }
  }
  EXPECT_TRUE(guard.health().finite()) << guard.health().text();
  EXPECT_EQ(net.stat.item<float>(), 3.0f) << "the skipped step's infinity was put back";
  {
    torch::NoGradGuard no_grad;
    net.running_max[3] = NAN;
  }
  EXPECT_EQ(guard.health().nonfinite, std::vector<std::string>{"buffer running_max"});
  {
    torch::NoGradGuard no_grad;
    net.fc->bias[0] = INFINITY;  // a parameter's infinity is sick, a buffer's is not
  }
  EXPECT_EQ(guard.health().nonfinite, (std::vector<std::string>{"parameter fc.bias", "buffer running_max"}));
}

// A NaN made where op-level capture cannot see (here an op run with
// RecordFunction off, as a fused or compiled kernel is unseen): every re-run is
// non-finite, so the step is reproduced, never called transient, and the
// remedy is not the transient skip.
TEST(ClosureStep, ANanNoCapturedOpMadeIsReproducedNotTransient) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
  GuardedStep r = guard.closure_step(
      [&] {
        at::Tensor h = net->forward(x);
        at::Tensor unseen;
        {
          at::RecordFunctionGuard invisible(false);
          unseen = torch::log(h.detach() * 0 - 1);  // NaN everywhere, from no op the capture sees
        }
        return torch::mse_loss(h + unseen, y);
      },
      {x, y});
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.first_birth.rfind("non-finite again on re-run, but no op was seen making it", 0), 0u) << r.first_birth;
  EXPECT_NE(r.remedy, Remedy::skip_transient) << log.str();
}

// One sample far out of range (a corrupt record): BatchNorm's batch variance
// overflows, so its running_var goes Inf, while its output ((x - mean) times
// 1/sqrt(var) = 0), the loss and the gradients stay finite. The op that wrote
// the Inf into the buffer is the birth, and the re-runs see the buffer, so the
// step is reproduced and its sample found, never called transient.
TEST(ClosureStep, ABufferAnOpWroteInfIntoIsBornThereAndItsSampleFound) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                            torch::nn::Linear(8, 1));
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  at::Tensor x = torch::randn({16, 4});
  const at::Tensor y = torch::randn({16, 1});
  BatchLoss loss = [&](const Batch& b) { return torch::mse_loss(net->forward(b.inputs), b.targets); };
  auto step = [&] { return guard.closure_step(loss, {x, y}); };
  ASSERT_TRUE(step().counted()) << log.str();
  x[5][1] = 1e30;  // squared, 1e60 times a weight's square: past float's range on every machine
  const GuardedStep failed = step();
  EXPECT_FALSE(failed.counted());
  EXPECT_EQ(failed.first_birth.rfind("inf at aten::batch_norm (forward) in module '1'", 0), 0u) << failed.first_birth;
  EXPECT_NE(log.str().find("non-finite buffers -> skipped; data: finite without batch row 5, out of the batch's range"),
            std::string::npos)
      << log.str();
  EXPECT_EQ(failed.remedy, Remedy::skip_data);
  EXPECT_TRUE(guard.health().finite()) << guard.health().text();
}

// An LR that is NaN for one step turns finite gradients into NaN weights:
// that update goes in (its gradients were finite), and the next step fails.
// No op of that step is the birth: the weights are named, nothing is re-run
// (the closure runs once), and the snapshot's capture says so when read back.
TEST(ClosureStep, WeightsAnUpdateMadeNonFiniteAreTheBirthReadNotReRun) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  GuardOptions options = quiet(dir.file("run"), log);
  options.rollback.every = 2;
  StepGuard guard(net, optimizer, options);
  const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
  int closure_calls = 0;
  auto step = [&] {
    return guard.closure_step(
        [&] {
          ++closure_calls;
          return torch::mse_loss(net->forward(x), y);
        },
        {x, y});
  };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(step().counted()) << log.str();
  optimizer.param_groups()[0].options().set_lr(std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(step().counted()) << log.str();  // step 3: finite gradients, NaN weights after
  optimizer.param_groups()[0].options().set_lr(0.01);
  closure_calls = 0;
  const GuardedStep failed = step();
  EXPECT_FALSE(failed.counted());
  EXPECT_EQ(closure_calls, 1) << "the step ran once, and was not re-run from the sick weights";
  EXPECT_EQ(failed.first_birth.rfind("born before this step: its weights held NaN/Inf as it began (parameter weight, "
                                     "parameter bias)",
                                     0),
            0u)
      << failed.first_birth;
  EXPECT_EQ(failed.rolled_back_to, 1) << log.str();
  ASSERT_FALSE(failed.snapshot.empty());
  const probe::SnapshotContents snapshot = probe::read_snapshot(failed.snapshot);
  EXPECT_EQ(snapshot.capture.nonfinite_weights, (std::vector<std::string>{"weight", "bias"}));
  EXPECT_FALSE(snapshot.capture.first_birth.has_value());
}

// The same, with a loss that raises on the NaN it is given (binary cross
// entropy checks its input is in [0, 1]): the weights explain the exception,
// so the step is a skip naming them, not a ModelError out of the loop.
TEST(ClosureStep, ALossThatRaisesOnWeightsThatHeldTheNanIsASkipNamingThem) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  GuardOptions options = quiet(dir.file("run"), log);
  options.rollback.every = 1;  // a state to go back to, so the run goes on
  StepGuard guard(net, optimizer, options);
  const at::Tensor x = torch::randn({8, 4}), y = torch::rand({8, 1});
  auto step = [&] {
    return guard.closure_step([&] { return torch::binary_cross_entropy(torch::sigmoid(net->forward(x)), y); }, {x, y});
  };
  ASSERT_TRUE(step().counted()) << log.str();
  optimizer.param_groups()[0].options().set_lr(std::numeric_limits<double>::quiet_NaN());
  ASSERT_TRUE(step().counted()) << log.str();
  optimizer.param_groups()[0].options().set_lr(0.01);
  GuardedStep failed;
  ASSERT_NO_THROW(failed = step()) << log.str();
  EXPECT_FALSE(failed.counted());
  EXPECT_FALSE(failed.error.empty()) << "the loss raised";
  EXPECT_EQ(failed.first_birth.rfind("born before this step: its weights held NaN/Inf as it began", 0), 0u)
      << failed.first_birth;
  EXPECT_EQ(failed.rolled_back_to, 0) << log.str();
}

// A loss that raises on a NaN (binary_cross_entropy checks its input is in
// [0, 1]): the NaN the batch brought explains the exception, so the step is a
// skip with that birth and a snapshot, not an exception out of the loop.
TEST(ClosureStep, ALossThatRaisesAfterABirthIsASkipWithThatBirth) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 4);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  at::Tensor x = torch::rand({6, 4});
  x[2][1] = std::numeric_limits<float>::quiet_NaN();  // a NaN pixel
  BatchLoss vae_loss = [&](const Batch& b) {
    return torch::binary_cross_entropy(torch::sigmoid(net->forward(b.inputs)), b.inputs);
  };
  GuardedStep r;
  ASSERT_NO_THROW(r = guard.closure_step(vae_loss, {x, x})) << log.str();
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.first_birth, "nan at input (input) in module '', batch row 2") << log.str();
  EXPECT_FALSE(r.snapshot.empty());
  EXPECT_NE(r.error.find("between 0 and 1"), std::string::npos) << r.error;

  // An exception with no birth before it reaches the loop, and says so.
  const at::Tensor wrong = torch::rand({6, 3});
  try {
    guard.closure_step([&] { return torch::mse_loss(net->forward(wrong), wrong); }, {wrong, wrong});
    FAIL() << "a shape error is the loop's own";
  } catch (const ModelError& e) {
    EXPECT_NE(std::string(e.what()).find("no NaN or Inf was born before it"), std::string::npos) << e.what();
  }
}

// The optimizer's own error (here a step() that throws, as LibTorch's Adam
// does on sparse gradients) comes after the gradients were found finite:
// there is no NaN to look for, so nothing is re-run and the loop gets the
// optimizer's exception as it was thrown, not one about the model.
TEST(ClosureStep, AnOptimizerThatRaisesReachesTheLoopAsItselfWithNoReRun) {
  struct Refusing : torch::optim::SGD {
    using torch::optim::SGD::SGD;
    at::Tensor step(LossClosure closure = nullptr) override {
      if (refuse) throw std::domain_error("the optimizer's own error");
      return torch::optim::SGD::step(std::move(closure));
    }
    bool refuse = false;
  };
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(4, 1);
  Refusing optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::randn({8, 4}), y = torch::randn({8, 1});
  int calls = 0;
  BatchLoss loss = [&](const Batch& b) {
    ++calls;
    return torch::mse_loss(net->forward(b.inputs), b.targets);
  };
  ASSERT_TRUE(guard.closure_step(loss, {x, y}).counted()) << log.str();
  optimizer.refuse = true;
  calls = 0;
  EXPECT_THROW(guard.closure_step(loss, {x, y}), std::domain_error);
  EXPECT_EQ(calls, 1) << "no forensic re-run";
  EXPECT_EQ(log.str().find("raised"), std::string::npos) << log.str();
  optimizer.refuse = false;
  EXPECT_TRUE(guard.closure_step(loss, {x, y}).counted()) << "the guard goes on where the loop does\n" << log.str();
}

// An embedding with sparse gradients (as recommenders train them), which
// LibTorch 1.13's foreach kernels refuse: the step checks, clips and applies
// it, and a step a NaN is born in is skipped with the embedding as it was
// (its norm against clip_grad_norm_'s: tests/python/test_invisible.py).
TEST(ClosureStep, SparseGradientsAreNormedClippedAndSkippedAsDenseOnes) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(16, 4).sparse(true));
  torch::nn::Linear head(4, 1);
  std::vector<at::Tensor> parameters = emb->parameters();
  for (const at::Tensor& p : head->parameters()) parameters.push_back(p);
  torch::optim::SGD optimizer(parameters, 0.1);
  torch::nn::Sequential net(emb, head);
  std::ostringstream log;
  GuardOptions options = quiet(dir.file("run"), log);
  options.clip = 1e-3;
  StepGuard guard(net, optimizer, options);
  const at::Tensor idx = torch::randint(0, 16, {8, 3});
  at::Tensor y = torch::randn({8, 3, 1});
  BatchLoss loss = [&](const Batch& b) { return torch::mse_loss(net->forward(b.inputs), b.targets); };

  const at::Tensor before = emb->weight.detach().clone();
  const GuardedStep clean = guard.closure_step(loss, {idx, y});
  ASSERT_TRUE(clean.counted()) << log.str();
  EXPECT_TRUE(std::isfinite(clean.outcome.grad_norm));
  EXPECT_GT(clean.outcome.grad_norm, 1e-3) << "the clip acts";
  // A sparse update moves the rows the batch used, and only those.
  const at::Tensor used = at::zeros({16}, at::kBool).index_fill_(0, idx.flatten(), true);
  const at::Tensor moved = (emb->weight != before).any(1);
  EXPECT_TRUE(torch::equal(moved, used)) << moved << used;

  y[2][1][0] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor kept = emb->weight.detach().clone();
  const GuardedStep failed = guard.closure_step(loss, {idx, y});
  EXPECT_FALSE(failed.counted());
  EXPECT_EQ(failed.first_birth, "nan at input (input) in module '', batch row 2") << log.str();
  EXPECT_TRUE(torch::equal(emb->weight, kept));
}

// An LSTM's carried state is (layers, batch, hidden) beside (batch, seq)
// data: each tensor's rows are found along its own dimension, so the row
// search cuts the sample out of both, names the row, and the run keeps its
// precision and LR. A state whose layers are as many as the samples cannot
// be told by its shape: the search that fails says so and escalates nothing,
// and the loop's declared row dimensions make it run.
TEST(ClosureStep, EachTensorOfANestedBatchIsCutAlongItsOwnRowDimension) {
  struct Tagger : torch::nn::Module {
    Tagger() {
      lstm = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(3, 5).num_layers(2).batch_first(true)));
    }
    torch::nn::LSTM lstm{nullptr};
  };
  auto run = [](int64_t batch, std::vector<int64_t> row_dims, std::string& log_text) {
    TempDir dir;
    torch::manual_seed(0);
    Tagger net;
    torch::optim::SGD optimizer(net.parameters(), 0.01);
    std::ostringstream log;
    GuardOptions o{dir.file("run"), Amp::fp32};
    o.log = &log;
    o.fallback = FallbackMode::automatic;
    StepGuard guard(net, optimizer, o);
    at::Tensor data = torch::rand({batch, 4, 3}), targets = torch::rand({batch, 4, 5});
    data[1] *= -1;  // one sample whose mean goes negative: its log is NaN
    const at::Tensor h0 = torch::zeros({2, batch, 5}), c0 = torch::zeros({2, batch, 5});
    BatchLoss loss = [&](const Batch& b) {
      auto [out, state] = net.lstm->forward(b.leaves[0], std::make_tuple(b.leaves[2], b.leaves[3]));
      return torch::mse_loss(out, b.leaves[1]) + torch::log(b.leaves[0].mean({1, 2})).mean();
    };
    GuardedStep r = guard.closure_step(loss, Batch::of({data, targets, h0, c0}, std::move(row_dims)));
    log_text = log.str();
    return r;
  };
  std::string log;
  GuardedStep r = run(6, {}, log);
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log;  // an ordinary sample the loss's log cannot take
  EXPECT_NE(log.find("finite without batch row 1"), std::string::npos) << log;

  r = run(2, {}, log);  // two layers, two samples: the state is cut along its layers
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log;
  EXPECT_NE(log.find("the row search could not run"), std::string::npos) << log;
  EXPECT_NE(log.find("row_dims"), std::string::npos) << log;

  r = run(2, {0, 0, 1, 1}, log);  // declared
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log;
  EXPECT_NE(log.find("finite without batch row 1"), std::string::npos) << log;
}

TEST(NestedBatch, ATensorWhoseRowsTwoDimensionsCouldHoldIsRefusedByName) {
  const Batch b = Batch::of({torch::zeros({2, 3}), torch::zeros({5, 2, 2})});
  EXPECT_EQ(b.rows(), 2);
  try {
    b.without_row(0);
    FAIL() << "(5, 2, 2) has the 2 samples along dimension 1 or 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor [1] of shape (5, 2, 2) holds the batch's 2 samples along dimension "
                                         "1 and 2 alike"),
              std::string::npos)
        << e.what();
  }
  const Batch declared = Batch::of({torch::zeros({2, 3}), torch::zeros({5, 2, 2})}, {0, 2});
  EXPECT_EQ(declared.without_row(0).leaves[1].sizes(), (std::vector<int64_t>{5, 2, 1}));
}

// A float64 model (an LBFGS time-series fit): "full precision" is its own.
// The fallback widens nothing of it and narrows nothing; the run goes on in
// float64, and its opening line says so.
TEST(ClosureStep, AFloat64ModelStaysFloat64ThroughTheFallback) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(3, 1);
  net->to(at::kDouble);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  std::ostringstream log;
  GuardOptions o{dir.file("run"), Amp::fp32};
  o.log = &log;
  o.fallback = FallbackMode::whole;
  StepGuard guard(net, optimizer, o);
  EXPECT_NE(log.str().find("amp off (the model's own float64)"), std::string::npos) << log.str();
  auto step = [&](bool poisoned) {
    at::Tensor x = torch::randn({8, 3}, at::kDouble), y = torch::randn({8, 1}, at::kDouble);
    if (poisoned) x[4][0] = std::numeric_limits<double>::quiet_NaN();
    return guard.closure_step([&] { return torch::mse_loss(net->forward(x), y); }, {x, y});
  };
  EXPECT_TRUE(step(false).counted());
  const GuardedStep failed = step(true);
  EXPECT_FALSE(failed.counted());
  EXPECT_TRUE(failed.fell_back) << log.str();
  EXPECT_EQ(net->weight.scalar_type(), at::kDouble);
  GuardedStep after;
  ASSERT_NO_THROW(after = step(false)) << "mat1 and mat2 must have the same dtype, had the weights gone float32";
  EXPECT_TRUE(after.counted());
  EXPECT_EQ(net->weight.scalar_type(), at::kDouble);
}

// A model trained in bf16 itself, fed bf16 batches: the fallback keeps its
// weights bf16 (float32 weights would make the loop's next batch raise) and
// is the LR cut, and its opening line and fallback line say so.
TEST(ClosureStep, AModelOfItsOwnBf16WeightsKeepsThemThroughTheFallback) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(3, 1);
  net->to(at::kBFloat16);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  std::ostringstream log;
  GuardOptions o = quiet(dir.file("run"), log);
  o.fallback = FallbackMode::whole;
  StepGuard guard(net, optimizer, o);
  EXPECT_NE(log.str().find("the model's own bfloat16 weights staying bfloat16"), std::string::npos) << log.str();
  auto step = [&](bool poisoned) {
    at::Tensor x = torch::randn({8, 3}).to(at::kBFloat16), y = torch::randn({8, 1}).to(at::kBFloat16);
    if (poisoned) x[4][0] = std::numeric_limits<float>::quiet_NaN();
    return guard.closure_step([&] { return torch::mse_loss(net->forward(x), y); }, {x, y});
  };
  EXPECT_TRUE(step(false).counted());
  const GuardedStep failed = step(true);
  EXPECT_FALSE(failed.counted());
  EXPECT_TRUE(failed.fell_back) << log.str();
  EXPECT_NE(log.str().find("fallback bf16: LR x 0.5 (the model's own bfloat16 weights stay"), std::string::npos)
      << log.str();
  EXPECT_EQ(guard.lr_multiplier(), 0.5);
  GuardedStep after;
  ASSERT_NO_THROW(after = step(false)) << "mat1 and mat2 must have the same dtype, had the weights gone float32";
  EXPECT_TRUE(after.counted());
  EXPECT_EQ(net->weight.scalar_type(), at::kBFloat16);
}

// Asked to run a module of bf16 weights in fp32, the guard refuses as it is
// made, saying how to widen the module: autocast off inside it would still
// compute in bf16 (and the float32 inputs of an fp32 module would not match
// its weights). Widened, the module is taken.
TEST(ClosureStep, AModuleOfBf16WeightsAskedForInFp32IsRefusedWithHowToWidenIt) {
  TempDir dir;
  torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::ReLU(), torch::nn::Linear(4, 1));
  net->to(at::kBFloat16);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  std::ostringstream log;
  GuardOptions o = quiet(dir.file("run"), log);
  o.fp32_modules = {"2"};
  try {
    StepGuard guard(net, optimizer, o);
    ADD_FAILURE() << "a module of bf16 weights was taken for fp32";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("module '2' holds bfloat16 weights (2.weight)"), std::string::npos) << what;
    EXPECT_NE(what.find("widen it first"), std::string::npos) << what;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("run") + "/run.h5"));
  net->ptr(2)->to(at::kFloat);
  EXPECT_NO_THROW(StepGuard(net, optimizer, o));
}

// A step that draws random numbers (a VAE's randn_like) draws differently
// without a row: a finite re-run then proves nothing about that row. The row
// search puts a copy of another row in each row's place instead, so every
// shape and every draw stay, as nanscope-replay does on the snapshot, and
// finds the blank sample; the line says how it was tested. The same step
// without the draw finds the row by removing it.
TEST(ClosureStep, TheRowSearchReplacesRowsOfAStepThatDrawsRandomNumbersAsTheReplayDoes) {
  auto run = [](bool draws, std::string& log_text) {
    TempDir dir;
    torch::manual_seed(0);
    torch::nn::Linear net(6, 1);
    torch::optim::SGD optimizer(net->parameters(), 0.01);
    std::ostringstream log;
    GuardOptions o{dir.file("run"), Amp::bf16};
    o.log = &log;
    StepGuard guard(net, optimizer, o);
    at::Tensor x = torch::rand({8, 6});
    x[5].fill_(0.25);  // a blank sample: std 0, log -inf
    const at::Tensor y = torch::randn({8, 1});
    BatchLoss loss = [&](const Batch& b) {
      const at::Tensor noise = draws ? torch::randn_like(b.inputs) * 1e-3 : torch::zeros_like(b.inputs);
      const at::Tensor scale = torch::log(b.inputs.std(1, true, true)).unsqueeze(1);
      return torch::mse_loss(net->forward(b.inputs + noise) * scale, b.targets);
    };
    GuardedStep r = guard.closure_step(loss, {x, y});
    log_text = log.str();
    return r;
  };
  std::string log;
  GuardedStep r = run(true, log);
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log;
  EXPECT_FALSE(r.fell_back) << log;
  // Each row replaced by a copy of another, so the noise drawn stays the same.
  EXPECT_NE(log.find(std::string("finite without batch row 5 (") + kRowsReplacedText + "), an ordinary sample"),
            std::string::npos)
      << log;

  r = run(false, log);
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log;  // a blank sample: the op's trigger
  EXPECT_NE(log.find("finite without batch row 5, an ordinary sample"), std::string::npos) << log;
}

// A batch trained on at every step (a tutorial's full-batch loop, an RL
// rollout's reused minibatch) with one NaN target: every step fails on the
// same sample. Each is skipped as data, the later ones worded "again (as
// step N)"; nothing escalates: no rollback (a state is kept to go back to),
// no LR cut, no fallback, no stop, and the run trains on once the data is fixed.
TEST(ClosureStep, TheSameDataFaultEveryStepIsSkippedAgainAndEscalatesNothing) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(3, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  GuardOptions o = quiet(dir.file("run"), log);
  o.rollback.every = 2;
  StepGuard guard(net, optimizer, o);
  const at::Tensor x = torch::randn({8, 3});
  at::Tensor y = torch::randn({8, 1});
  BatchLoss loss = [&](const Batch& b) { return torch::mse_loss(net->forward(b.inputs), b.targets); };
  for (int step = 0; step < 6; ++step) ASSERT_TRUE(guard.closure_step(loss, {x, y}).counted()) << log.str();
  y[4][0] = std::numeric_limits<float>::quiet_NaN();
  for (int step = 6; step < 30; ++step) {
    // The sample moves from row to row: it is known by its values.
    const at::Tensor order = torch::randperm(8);
    const GuardedStep r = guard.closure_step(loss, {x.index_select(0, order), y.index_select(0, order)});
    ASSERT_FALSE(r.counted());
    EXPECT_EQ(r.remedy, Remedy::skip_data) << log.str();
    EXPECT_LT(r.rolled_back_to, 0) << log.str();
    EXPECT_FALSE(r.fell_back) << log.str();
  }
  EXPECT_NE(log.str().find("step 29: non-finite loss -> skipped; data: again (as step 6)"), std::string::npos)
      << log.str();
  EXPECT_EQ(guard.lr_multiplier(), 1.0);
  EXPECT_EQ(guard.rollbacks(), 0);
  EXPECT_FALSE(guard.stopped());
  y[4][0] = 0.5f;
  EXPECT_TRUE(guard.closure_step(loss, {x, y}).counted()) << log.str();
}

// A batch of one sample: no row search can tell the sample from the model.
// Non-finite at fp32 too, so no precision remedy; the line says why the
// search did not run.
TEST(ClosureStep, AOneRowBatchTakesNoFallbackAndSaysTheSearchCannotRun) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(3, 1);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor x = torch::tensor({{0.5f, -0.25f, -0.25f}}), y = torch::zeros({1, 1});
  BatchLoss loss = [&](const Batch& b) {
    return torch::mse_loss(net->forward(b.inputs), b.targets) + torch::log(b.inputs.sum());  // log(0)
  };
  const GuardedStep r = guard.closure_step(loss, {x, y});
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log.str();
  EXPECT_FALSE(r.fell_back);
  EXPECT_EQ(guard.amp(), Amp::bf16);
  EXPECT_EQ(guard.lr_multiplier(), 1.0);
  EXPECT_NE(log.str().find("the row search cannot run on a batch of one row"), std::string::npos) << log.str();
}

// A batch whose carried state (1, 8, 8) holds its 8 samples along two
// dimensions alike: which one is the rows no shape can say. The guard says so
// at the first step that shows it, naming the tensor and how to declare it;
// a failed step is still skipped, its row search skipped with that reason,
// and no exception leaves the step.
TEST(ClosureStep, AnAmbiguousRowDimensionIsToldAtTheFirstStepAndNeverThrowsOutOfAStep) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Linear net(8, 8);
  torch::optim::SGD optimizer(net->parameters(), 0.01);
  std::ostringstream log;
  StepGuard guard(net, optimizer, quiet(dir.file("run"), log));
  const at::Tensor h = torch::zeros({1, 8, 8});
  BatchLoss loss = [&](const Batch& b) {
    const at::Tensor x = b.leaves[0], y = b.leaves[1];
    return torch::mse_loss(net->forward(x + b.leaves[2][0]), y) + torch::log(x.abs().sum(1)).mean();
  };
  at::Tensor x = torch::rand({8, 8}) + 0.1;
  const at::Tensor y = torch::randn({8, 8});
  GuardedStep r = guard.closure_step(loss, Batch::of({x, y, h}));
  EXPECT_TRUE(r.counted()) << log.str();
  EXPECT_NE(log.str().find("along dimension 1 and 2 alike"), std::string::npos) << log.str();
  x[3].zero_();  // log(0)
  EXPECT_NO_THROW(r = guard.closure_step(loss, Batch::of({x, y, h}))) << log.str();
  EXPECT_FALSE(r.counted()) << log.str();
  EXPECT_EQ(r.remedy, Remedy::skip_model_or_data) << log.str();
}

// A program that trains raw tensors (W and b, an SGD over them) and no
// module's parameters: the guard is given an empty module and the optimizer,
// steers W and b as the optimizer's ("optimizer.0.0", "optimizer.0.1"), and
// every clean step is the plain loop's, bit for bit.
TEST(ClosureStep, ARawTensorProgramIsGuardedThroughItsOptimizer) {
  auto run = [](bool guarded) {
    TempDir dir;
    torch::manual_seed(0);
    at::Tensor W = torch::zeros({3, 1}).requires_grad_(), b = torch::zeros({1}).requires_grad_();
    torch::optim::SGD optimizer({W, b}, 0.1);
    torch::nn::Module none;
    std::ostringstream log;
    std::optional<StepGuard> guard;
    GuardOptions o = quiet(dir.file("run"), log);
    o.amp = Amp::fp32;  // as the plain loop runs
    if (guarded) guard.emplace(none, optimizer, o);
    for (int step = 0; step < 6; ++step) {
      at::Tensor x = torch::randn({8, 3});
      const at::Tensor y = (x.select(1, 0) > 0).to(at::kFloat).unsqueeze(1);
      if (step == 4) x[2][1] = std::numeric_limits<float>::quiet_NaN();
      auto loss = [&] { return torch::binary_cross_entropy_with_logits(x.matmul(W) + b, y); };
      if (guarded) {
        const GuardedStep r = guard->closure_step(loss, {x, y});
        EXPECT_EQ(r.counted(), step != 4) << log.str();
        if (step == 4) {
          EXPECT_EQ(r.remedy, Remedy::skip_data) << log.str();
        }
      } else {
        optimizer.zero_grad();
        loss().backward();
        if (step != 4) optimizer.step();
      }
    }
    if (guarded) {
      const StateHealth health = guard->health();
      EXPECT_TRUE(health.finite()) << health.text();
    }
    return std::make_pair(W.detach().clone(), b.detach().clone());
  };
  const auto guarded = run(true), plain = run(false);
  EXPECT_TRUE(at::equal(guarded.first, plain.first)) << guarded.first << plain.first;
  EXPECT_TRUE(at::equal(guarded.second, plain.second));
}

TEST(ClosureStep, ANanInABatchLeafTheStepNeverReadsIsANoteNotTheBirth) {
  // open_clip's accumulation loop carries features cached by a no-grad pass
  // beside the batch; one holds a NaN the loss never reads, while the model's
  // own log makes the step's NaN.
  TempDir dir;
  torch::manual_seed(0);
  Nested net;
  torch::optim::SGD optimizer(net.parameters(), 0.01);
  std::ostringstream log;
  GuardOptions o = quiet(dir.file("run"), log);
  o.fallback = FallbackMode::automatic;
  StepGuard guard(net, optimizer, o);
  const at::Tensor x = torch::randn({6, 4}), y = torch::randn({6, 1});
  at::Tensor cached = torch::randn({6, 3});
  cached[2][1] = std::numeric_limits<float>::quiet_NaN();
  BatchLoss loss = [&](const Batch& b) {
    return torch::mse_loss(net.forward(b.leaves[0], /*poisoned_block=*/1), b.leaves[1]);
  };
  GuardedStep r = guard.closure_step(loss, Batch::of({x, y, cached}));
  EXPECT_FALSE(r.counted());
  EXPECT_EQ(r.first_birth.rfind("nan at aten::log (forward) in module 'blocks.1'", 0), 0u) << r.first_birth;
  EXPECT_NE(r.first_birth.find("nan at input '[2]' (input) in module '', batch row 2"), std::string::npos)
      << "the unread leaf is a note: " << r.first_birth;
  EXPECT_NE(r.remedy, Remedy::skip_data) << log.str();

  // The same leaf read by the loss is the birth, and the batch the cause.
  BatchLoss reads_it = [&](const Batch& b) {
    return torch::mse_loss(net.forward(b.leaves[0]), b.leaves[1]) + b.leaves[2].mean();
  };
  r = guard.closure_step(reads_it, Batch::of({x, y, cached}));
  EXPECT_EQ(r.first_birth.rfind("nan at input '[2]' (input)", 0), 0u) << r.first_birth;
  EXPECT_EQ(r.remedy, Remedy::skip_data) << log.str();
}
