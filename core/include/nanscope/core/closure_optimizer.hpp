#pragma once
// Optimizers whose step() evaluates the loss itself, several times per step:
// L-BFGS moves the weights to trial points and asks for the loss and the
// gradients at each. The guard's closure step (the same form as for any
// optimizer: the closure returns the loss) gives such an optimizer a closure
// that runs the step's forward and backward again at the weights it is at,
// under the guard's precision and loss scale, and checks each evaluation. An
// evaluation that goes non-finite ends the step there: the weights and the
// optimizer's state go back to before the step, the step is skipped (one row
// per step, however many evaluations), and its forensics re-run the
// evaluation that failed, at its trial point. The cost: a copy of the weights
// and of the optimizer's state before each step.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <vector>

namespace nanscope {

// An optimizer of your own that evaluates a closure in step() derives from
// this as well (torch::optim::LBFGS is known without it); Python's adapter
// answers for the torch.optim optimizer it holds.
class EvaluatesClosure {
 public:
  virtual ~EvaluatesClosure() = default;
  virtual bool evaluates_closure() const { return true; }
};

bool evaluates_closure(const torch::optim::Optimizer& optimizer);

// One evaluation at the optimizer's current weights: the unscaled loss, and
// whether loss and gradients (unscaled, as the optimizer reads them) are finite.
struct Evaluation {
  at::Tensor loss;
  bool loss_finite = true, grads_finite = true;
};

// What the step's evaluations came to. `failed` is the 1-based number of the
// evaluation that went non-finite (0: none; the first is the guard's own
// step), `failed_point` the weights it ran at.
struct ClosureEvaluations {
  int count = 0;
  int failed = 0;
  bool loss_finite = true;
  std::vector<at::Tensor> failed_point;
};

// optimizer.step(closure): the closure's first call returns `first_loss` (the
// step's own evaluation, its gradients in place), each later one
// `evaluate()`. On a non-finite evaluation the step stops, and the weights
// and optimizer state go back to before it; so they do when an evaluation
// raises (the exception goes on). Returns what the evaluations came to.
ClosureEvaluations step_with_closure(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& parameters,
                                     const at::Tensor& first_loss, const std::function<Evaluation()>& evaluate);

}  // namespace nanscope
