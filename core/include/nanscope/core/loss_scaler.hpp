#pragma once
// A dynamic loss scaler with torch.amp.GradScaler's semantics (P5/P7 of the
// playbook), written in C++ because LibTorch has none. The scale lives on the
// host: the step already copies its finiteness verdict to the host once for
// the skip decision, so updating the scale there costs no extra sync.
#include <ATen/ATen.h>

#include <vector>

namespace nanscope {

struct LossScalerConfig {
  bool enabled = false;  // fp16 only; bf16 and fp32 need no scaling (P6)
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});

  at::Tensor scale_loss(const at::Tensor& loss) const;

  // Divides every gradient by the scale in place and returns a one-element
  // float tensor (on the gradients' device) that is 1 when any gradient held
  // an Inf or NaN. Uses the fused _amp op where it has a kernel; otherwise a
  // plain-tensor path with the same result. Never syncs with the device.
  at::Tensor unscale_(const std::vector<at::Tensor>& grads) const;

  // unscale_'s flag for a step the scaler does not scale (nothing unscaled,
  // nothing found): one 0 kept per device, not made each step. Never written.
  const at::Tensor& none_found(const at::Device& device);

  // GradScaler.update(): back off and reset on inf, grow after
  // growth_interval clean steps (only to a finite scale).
  void update(bool found_inf);

  bool enabled() const { return config_.enabled; }
  double scale() const { return config_.enabled ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // A resumed run's scale and growth count, as saved.
  void restore(double scale, int64_t growth_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
  }
  // The one-shot fp32 fallback switches scaling off for good.
  void disable() { config_.enabled = false; }

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t growth_tracker_ = 0;
  at::Tensor none_found_;
};

}  // namespace nanscope
