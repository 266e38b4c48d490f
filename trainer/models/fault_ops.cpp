#include "models/fault_ops.hpp"

namespace nanscope::fault_ops {

at::Tensor log_of_activation(const at::Tensor& activation) { return at::log(activation); }

at::Tensor add_rms_of_zeros(const at::Tensor& x) {
  at::Tensor zeros = x * 0.0;
  return x + at::sqrt(zeros.pow(2).mean(-1, /*keepdim=*/true));
}

at::Tensor layer_norm_without_eps_on_constant_row(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& bias) {
  // Row 0 of the flattened batch becomes its own mean: constant across features.
  at::Tensor flat = x.reshape({-1, x.size(-1)});
  at::Tensor row_mask = at::zeros({flat.size(0), 1}, x.options().dtype(at::kBool));
  row_mask.index_fill_(0, at::zeros({1}, x.options().dtype(at::kLong)), true);
  at::Tensor constant = flat.mean(-1, /*keepdim=*/true).expand_as(flat);
  at::Tensor rows = at::where(row_mask, constant, flat);
  at::Tensor mean = rows.mean(-1, /*keepdim=*/true);
  at::Tensor var = (rows - mean).pow(2).mean(-1, /*keepdim=*/true);
  at::Tensor normed = (rows - mean) / at::sqrt(var);
  return (normed * weight + bias).reshape(x.sizes());
}

at::Tensor cross_entropy_by_naive_softmax(const at::Tensor& logits, const at::Tensor& targets) {
  at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  // Logits carrying a large common offset (an unnormalised bias): harmless to a
  // max-subtracting softmax, fatal to this one. exp(x + 100) > 3.4e38 for x > -11.
  at::Tensor e = at::exp(flat + 100.0);
  at::Tensor probs = e / e.sum(-1, /*keepdim=*/true);
  at::Tensor picked = probs.gather(1, targets.reshape({-1, 1}));
  return -at::log(picked).mean();
}

}  // namespace nanscope::fault_ops
