#include "nanscope/models/sample_model.hpp"

#include <torch/nn/functional/loss.h>

#include "nanscope/models/fault_ops.hpp"

namespace nanscope {

bool SampleModel::plant_fault(const Fault& fault) {
  if (fault.kind == FaultKind::nonfinite_input || fault.kind == FaultKind::lr_spike) return false;
  fault_ = fault.kind;
  fault_arg_ = fault.arg;
  return true;
}

at::Tensor SampleModel::lm_loss(const at::Tensor& logits, const at::Tensor& targets) const {
  if (fault_ == FaultKind::exp_overflow) return fault_ops::cross_entropy_by_naive_softmax(logits, targets);
  at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  at::Tensor loss = torch::nn::functional::cross_entropy(flat, targets.reshape({-1}));
  if (z_loss_ > 0) {
    // P15: pull log Z towards 0 so the logits cannot drift without bound.
    at::Tensor log_z = at::logsumexp(flat.to(at::kFloat), {-1});
    loss = loss + z_loss_ * log_z.pow(2).mean();
  }
  return loss;
}

}  // namespace nanscope
