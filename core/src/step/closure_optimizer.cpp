#include "nanscope/core/closure_optimizer.hpp"

#include <c10/core/GradMode.h>
#include <torch/optim/lbfgs.h>

#include "nanscope/core/optimizer.hpp"

namespace nanscope {

bool evaluates_closure(const torch::optim::Optimizer& optimizer) {
  if (auto* own = dynamic_cast<const EvaluatesClosure*>(&optimizer)) return own->evaluates_closure();
  return dynamic_cast<const torch::optim::LBFGS*>(&optimizer) != nullptr;
}

namespace {

// Thrown through the optimizer's step() to end it at a non-finite evaluation.
struct NonFiniteEvaluation {};

// The weights and the optimizer's state before the step, put back on demand.
class BeforeTheStep {
 public:
  BeforeTheStep(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters)
      : optimizer_(optimizer), parameters_(parameters), state_(optimizer_bytes(optimizer)) {
    for (const auto& p : parameters) weights_.push_back(p.detach().clone());
  }
  void put_back() {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor p = parameters_[i];
      p.copy_(weights_[i]);
      if (p.grad().defined()) p.mutable_grad().reset();
    }
    load_optimizer_bytes(optimizer_, state_);
  }

 private:
  torch::optim::Optimizer& optimizer_;
  const std::vector<at::Tensor>& parameters_;
  std::vector<at::Tensor> weights_;
  std::string state_;
};

}  // namespace

ClosureEvaluations step_with_closure(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                                     const at::Tensor& first_loss, const std::function<Evaluation()>& evaluate) {
  BeforeTheStep before(optimizer, parameters);
  ClosureEvaluations out;
  auto closure = [&]() -> at::Tensor {
    if (++out.count == 1) return first_loss;
    // The optimizer calls it with gradients on, as a closure that runs backward needs.
    c10::AutoGradMode grad_on(true);
    const Evaluation e = evaluate();
    if (e.loss_finite && e.grads_finite) return e.loss;
    out.failed = out.count;
    out.loss_finite = e.loss_finite;
    for (const auto& p : parameters) out.failed_point.push_back(p.detach().clone());
    throw NonFiniteEvaluation{};
  };
  try {
    optimizer.step(closure);
  } catch (const NonFiniteEvaluation&) {
    before.put_back();
  } catch (...) {
    before.put_back();
    throw;
  }
  return out;
}

}  // namespace nanscope
