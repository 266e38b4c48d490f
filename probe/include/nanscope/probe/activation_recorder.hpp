#pragma once
// Per-layer activation abs-max for the steps that ask for it (every N steps):
// while alive, a light RecordFunction callback takes max|output| of every op
// run inside a layer's module scope (native models) or TorchScript module,
// accumulated on the device; result() copies all layers to the host once.
// Headroom to a precision's limit is log2(max_finite / absmax): 65504 for
// fp16, 3.39e38 for bf16 (docs/format.md).
#include <string>
#include <vector>

namespace nanscope::probe {

class ActivationRecorder {
 public:
  explicit ActivationRecorder(const std::vector<std::string>& layer_names);
  ~ActivationRecorder();
  ActivationRecorder(const ActivationRecorder&) = delete;
  ActivationRecorder& operator=(const ActivationRecorder&) = delete;

  // One value per layer; NaN for a layer no op ran in.
  std::vector<float> result() const;
};

// log2(limit / absmax): how many doublings an activation can take before it
// overflows `limit` (e.g. 65504 for fp16).
double headroom_bits(double absmax, double limit);

}  // namespace nanscope::probe
