#include "nanscope/models/fault_ops.hpp"

#include "nanscope/common/torch_compat.hpp"

namespace nanscope::fault_ops {

at::Tensor log_of_activation(const at::Tensor& activation) { return at::log(activation); }

at::Tensor add_rms_of_zeros(const at::Tensor& x) {
  at::Tensor zeros = x * 0.0;
  return x + at::sqrt(zeros.pow(2).mean(-1, /*keepdim=*/true));
}

at::Tensor layer_norm_without_eps_on_constant_row(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& bias) {
  // Row 0 of the flattened batch becomes its own mean: constant across features.
  // Rounded to a multiple of 1/8 so every partial sum of the row is exact and
  // the variance is exactly 0 whatever the reduction order (thread count, BLAS
  // build): with an arbitrary constant, mean() can miss it by an ulp and the
  // variance comes out 1e-15 instead of 0, and then there is no NaN to find.
  at::Tensor flat = x.reshape({-1, x.size(-1)});
  at::Tensor row_mask = at::zeros({flat.size(0), 1}, x.options().dtype(at::kBool));
  row_mask.index_fill_(0, at::zeros({1}, x.options().dtype(at::kLong)), true);
  at::Tensor constant = (flat.mean(-1, /*keepdim=*/true) * 8).round().div(8).expand_as(flat);
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

at::Tensor layer_norm_by_cancellation(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // Unit-variance features around +300: E[x^2] ~ 9e4 needs ~17 bits to keep
  // the variance of 1; fp32 has 24, bf16 has 8.
  at::Tensor standardized = (x - x.mean(-1, true)) / (x.std({-1}, /*unbiased=*/false, /*keepdim=*/true) + 1e-6);
  at::Tensor shifted = standardized + 300.0;
  // E[x^2] and E[x]^2 (~9e4, a variance of ~1 apart) each held in the
  // autocast type, as a low-precision matmul's outputs are: bf16's values
  // there are 512 apart, so both round to the same one and the variance is
  // exactly 0 (a row whose pair straddles a rounding boundary gets 512;
  // rounding is monotone, so never less than 0). That holds on every CPU. A
  // bf16 matmul would leave it to the kernel: oneDNN keeps an fp32 sum
  // (variance 0), LibTorch's own gemm (CPUs without AVX-512) rounds its running
  // sum and came out positive: no failure. Outside autocast the casts do
  // nothing and fp32 keeps the variance of 1.
  const std::optional<at::ScalarType> low = compat::autocast_dtype(x.device().type());
  auto held = [&](const at::Tensor& t) { return low ? t.to(*low) : t; };
  const at::Tensor values = held(shifted).to(at::kFloat);
  const at::Tensor mean = values.mean(-1, true);
  at::Tensor variance = held((values * values).mean(-1, true)) - held(mean * mean);
  return (shifted - mean) / at::sqrt(variance) * weight + bias;
}

at::Tensor blow_up_activation(const at::Tensor& h) { return (h + 100.0) * 1000.0; }

at::Tensor mask_row_zero_completely(const at::Tensor& future_mask) {
  at::Tensor row_zero = at::zeros_like(future_mask);
  row_zero.select(0, 0).fill_(true);
  return at::logical_or(future_mask, row_zero);
}

}  // namespace nanscope::fault_ops
