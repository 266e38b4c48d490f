#pragma once
// Gradient norms read on the host, for a clean CPU step whose norms only
// decide the verdict and go into the run file. LibTorch takes a norm as a
// reduction kernel, and on a small tensor the kernel's fixed cost is most of
// what it costs (an LSTM's 8 gradients, 25,000 floats, LibTorch 1.13, in a
// loop of their own: 16 us through _foreach_norm, 21 with the total; this
// pass 3.5). Here each tensor is read where it lies, in one vectorized pass
// summed in double. The values
// agree with LibTorch's to float rounding, not to the bit: where a norm is
// used as a value (a clip, a loop's unscale_(), the ranks' averaging), the
// step takes LibTorch's own (nanscope/core/train_step.hpp says when).
#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace nanscope::probe {

// Each tensor's squared L2 norm, in double. nullopt when any tensor is not a
// dense contiguous float32 CPU tensor, holds a NaN or an infinity, or the
// norms are large enough (1e18) that LibTorch's float sums could overflow
// where a double's does not: there the caller takes LibTorch's norms, so that
// a step's verdict never depends on which way its norms were taken.
std::optional<std::vector<double>> squared_norms_on_host(const std::vector<at::Tensor>& tensors);

}  // namespace nanscope::probe
