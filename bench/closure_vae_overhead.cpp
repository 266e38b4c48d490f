// What the closure form costs a small C++ loop on clean steps: pytorch/examples'
// MNIST VAE (784-400-20, Adam, bf16 autocast) on random images, trained
//   plain       by the stock LibTorch loop (autocast, backward, optimizer.step())
//   plain, none the same loop dropping the gradients (set to None) where the
//               stock loop's zero_grad() zeroes them (LibTorch 1.x): what the
//               guard does, so the guard's own time shows against it
//   probe off   through guard.closure_step with --probe off
//   probe on    through guard.closure_step as shipped (per-layer norms, the
//               RNG state and batch kept for a forensic re-run)
//   watched     the stock loop with the guard in the watched form (autocast(),
//               backward(loss, batch), step(); probe on, a loss function set
//               for the re-run, so the batch is kept as in a Python loop)
// All five arms in one process, step by step in turn, so they share the
// machine's state and noise. Prints each arm's median step time, its ratio to
// plain, and the guard's own time per step (the median difference), and the
// guarded arms' against plain, none.
// Usage: closure_vae_overhead [ROUNDS=9] [STEPS_PER_ROUND=30] [BATCH=128] [THREADS=1]
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.hpp"
#include "nanscope/common/stats.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/step_guard.hpp"

using namespace nanscope;

namespace {

struct Vae : torch::nn::Module {
  Vae() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 400));
    fc21 = register_module("fc21", torch::nn::Linear(400, 20));
    fc22 = register_module("fc22", torch::nn::Linear(400, 20));
    fc3 = register_module("fc3", torch::nn::Linear(20, 400));
    fc4 = register_module("fc4", torch::nn::Linear(400, 784));
  }
  at::Tensor loss(const at::Tensor& x) {
    const at::Tensor h = at::relu(fc1->forward(x));
    const at::Tensor mu = fc21->forward(h), logvar = fc22->forward(h);
    const at::Tensor z = mu + at::randn_like(mu) * at::exp(0.5 * logvar);
    const at::Tensor recon = at::sigmoid(fc4->forward(at::relu(fc3->forward(z))));
    const at::Tensor bce = at::binary_cross_entropy(recon.to(at::kFloat), x, {}, at::Reduction::Sum);
    const at::Tensor kld = -0.5 * at::sum(1 + logvar - mu.pow(2) - logvar.exp()).to(at::kFloat);
    return (bce + kld) / x.size(0);
  }
  torch::nn::Linear fc1{nullptr}, fc21{nullptr}, fc22{nullptr}, fc3{nullptr}, fc4{nullptr};
};

struct Arm {
  std::string name;
  std::shared_ptr<Vae> model = std::make_shared<Vae>();
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<StepGuard> guard;  // none: the plain loop
  bool grads_to_none = false;        // the plain loop drops its gradients instead of zeroing them
  bool watched = false;              // the guard in the watched form: the loop's own step
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  const bench::Args args(argc, argv, "closure_vae_overhead [ROUNDS=9] [STEPS_PER_ROUND=30] [BATCH=128] [THREADS=1]");
  const int64_t rounds = args.count(1, 9), steps = args.count(2, 30), batch = args.count(3, 128);
  const int threads = int(args.count(4, 1));
  at::set_num_threads(threads);
  const std::string dir = (std::filesystem::temp_directory_path() / "nanscope-closure-vae-bench").string();
  std::filesystem::remove_all(dir);

  std::vector<Arm> arms(5);
  arms[0].name = "plain";
  arms[1].name = "plain, none";
  arms[1].grads_to_none = true;
  arms[2].name = "probe off";
  arms[3].name = "probe on";
  arms[4].name = "watched";
  arms[4].watched = true;
  for (size_t a = 0; a < arms.size(); ++a) {
    torch::manual_seed(0);
    arms[a].model = std::make_shared<Vae>();
    arms[a].optimizer = std::make_unique<torch::optim::Adam>(arms[a].model->parameters(), 1e-3);
    if (a < 2) continue;
    GuardOptions options;
    options.run_dir = dir + "/" + std::to_string(a);
    options.amp = Amp::bf16;
    options.probe = a != 2;
    options.log = nullptr;
    arms[a].guard = std::make_unique<StepGuard>(*arms[a].model, *arms[a].optimizer, options);
    if (arms[a].watched)
      arms[a].guard->set_loss_fn([model = arms[a].model](const Batch& b) { return model->loss(b.inputs); });
  }
  const at::Tensor images = at::rand({batch, 784});

  // Each arm's k-th step draws the same noise (the VAE samples z), and
  // denormals are flushed: an arm's speed must not depend on its weights
  // (Adam's state going denormal on one arm's path cost it 10 ms a step at
  // batch 640, and all arms several times their step once they shared a path).
  at::globalContext().setFlushDenormal(true);
  auto run_step = [&](Arm& arm, int64_t k) {
    torch::manual_seed(uint64_t(k));
    const auto start = std::chrono::steady_clock::now();
    if (arm.watched) {
      arm.optimizer->zero_grad();
      at::Tensor loss;
      {
        const ScopedAutocast autocast = arm.guard->autocast();
        loss = arm.model->loss(images);
      }
      arm.guard->backward(loss, Batch(images));
      arm.guard->step().loss.item<double>();
    } else if (arm.guard) {
      arm.guard->closure_step([&] { return arm.model->loss(images); }, Batch(images)).loss.item<double>();
    } else {
      if (arm.grads_to_none)
        for (at::Tensor& p : arm.model->parameters()) p.mutable_grad().reset();
      else
        arm.optimizer->zero_grad();
      at::Tensor loss;
      {
        compat::AutocastGuard autocast(at::kCPU, at::kBFloat16, true);
        loss = arm.model->loss(images);
      }
      loss.backward();
      arm.optimizer->step();
      loss.item<double>();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // The arms take turns in a rotating order: none always runs right after
  // another (whose freed memory the allocator hands on, or not).
  auto in_turn = [&](int64_t k, bool timed) {
    for (size_t i = 0; i < arms.size(); ++i) {
      Arm& arm = arms[(size_t(k) + i) % arms.size()];
      const double seconds = run_step(arm, k);
      if (timed) arm.times.push_back(seconds);
    }
  };
  int64_t k = 0;
  for (; k < 5; ++k) in_turn(k, false);
  for (int64_t r = 0; r < rounds; ++r)
    for (int64_t s = 0; s < steps; ++s, ++k) in_turn(k, true);

  std::printf(
      "closure form, MNIST VAE 784-400-20, batch %lld, bf16, Adam, %d thread(s), %lld x %lld steps, LibTorch %s\n",
      static_cast<long long>(batch), threads, static_cast<long long>(rounds), static_cast<long long>(steps),
      TORCH_VERSION);
  // The mean as well: a state kept for rollback every 25 steps is in it, not in the median.
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double t : v) sum += t;
    return sum / double(v.size());
  };
  const double plain = median(arms[0].times), plain_mean = mean(arms[0].times), none = median(arms[1].times);
  for (const Arm& arm : arms) {
    const double m = median(arm.times), a = mean(arm.times);
    std::printf("  %-10s median step %7.3f ms  ratio %.3f  guard's own %+.3f ms | mean %7.3f ms  ratio %.3f",
                arm.name.c_str(), m * 1e3, m / plain, (m - plain) * 1e3, a * 1e3, a / plain_mean);
    // Every update applied, or the arm is no like-for-like of the plain loop.
    if (arm.guard && !arm.watched)
      std::printf("  (updates applied %lld of %lld; against plain, none: ratio %.3f, own %+.3f ms)",
                  static_cast<long long>(arm.guard->applied_steps()), static_cast<long long>(k), m / none,
                  (m - none) * 1e3);
    else if (arm.guard)  // the loop zeroes its gradients as plain does: plain is its like
      std::printf("  (updates applied %lld of %lld)", static_cast<long long>(arm.guard->applied_steps()),
                  static_cast<long long>(k));
    std::printf("\n");
  }
  std::filesystem::remove_all(dir);
  return 0;
}
