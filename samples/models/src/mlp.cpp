#include "nanscope/models/mlp.hpp"

#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <stdexcept>

#include "nanscope/models/fault_ops.hpp"
#include "nanscope/models/sample_model.hpp"
#include "nanscope/probe/module_scope.hpp"

namespace nanscope {

namespace {

namespace F = torch::nn::functional;

struct MlpNetImpl : torch::nn::Module {
  explicit MlpNetImpl(const MlpConfig& c) : config(c) {
    fc1 = register_module("fc1", torch::nn::Linear(c.in_features, c.hidden));
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    fc2 = register_module("fc2", torch::nn::Linear(c.hidden, c.hidden));
    head = register_module("head", torch::nn::Linear(c.hidden, c.classes));
  }
  // Faults: log in fc1's activation, no-eps norm in ln, zero-RMS in fc2, exp in the loss.
  at::Tensor logits(const at::Tensor& x, FaultKind fault) {
    at::Tensor h;
    {
      NANSCOPE_MODULE_SCOPE("fc1");
      h = fc1(x);
      if (fault == FaultKind::activation_overflow) h = fault_ops::blow_up_activation(h);
      h = F::gelu(h);
      if (fault == FaultKind::log_nonpositive) h = fault_ops::log_of_activation(h);
    }
    {
      NANSCOPE_MODULE_SCOPE("ln");
      // The norm runs in the parameters' precision (fp32) as under any AMP
      // policy; LibTorch 1.13's CPU layer_norm rejects bf16 input with fp32 weights.
      h = h.to(ln->weight.scalar_type());
      if (fault == FaultKind::zero_variance_norm)
        h = fault_ops::layer_norm_without_eps_on_constant_row(h, ln->weight, ln->bias);
      else if (fault == FaultKind::variance_cancellation)
        h = fault_ops::layer_norm_by_cancellation(h, ln->weight, ln->bias);
      else
        h = ln(h);
    }
    {
      NANSCOPE_MODULE_SCOPE("fc2");
      h = fc2(h);
      if (fault == FaultKind::sqrt_grad_zero) h = fault_ops::add_rms_of_zeros(h);
    }
    NANSCOPE_MODULE_SCOPE("head");
    return head(F::gelu(h));
  }
  MlpConfig config;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
TORCH_MODULE(MlpNet);

class MlpModel : public SampleModel {
 public:
  explicit MlpModel(MlpNet net) : SampleModel(net.ptr()), net_(std::move(net)) {}
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    if (!at::isFloatingType(inputs.scalar_type()) || inputs.dim() != 2 || inputs.size(1) != net_->config.in_features)
      throw std::invalid_argument("mlp expects float inputs of shape [batch, " +
                                  std::to_string(net_->config.in_features) + "]");
    return lm_loss(net_->logits(inputs.to(at::kFloat), fault_), targets);
  }
  bool plant_fault(const Fault& fault) override {
    // No attention here, and the head's input is the growth faults' business in the gpt.
    const bool hosted = fault.kind != FaultKind::masked_row && fault.kind != FaultKind::attention_logit_growth &&
                        fault.kind != FaultKind::logit_drift;
    return hosted && SampleModel::plant_fault(fault);
  }
  ModelSpec spec() const override {
    const MlpConfig& c = net_->config;
    return {"mlp", {{"in_features", c.in_features}, {"hidden", c.hidden}, {"classes", c.classes}}, {}};
  }

 private:
  MlpNet net_;
};

}  // namespace

std::unique_ptr<TrainableModel> make_mlp(const MlpConfig& c, uint64_t seed) {
  if (c.in_features < 1 || c.hidden < 1 || c.classes < 2)
    throw std::invalid_argument("mlp sizes must be positive (and at least 2 classes)");
  torch::manual_seed(seed);
  return std::make_unique<MlpModel>(MlpNet(c));
}

MlpConfig mlp_config_from(const ModelSpec& spec) {
  MlpConfig c;
  read_hparam(spec, "in_features", c.in_features);
  read_hparam(spec, "hidden", c.hidden);
  read_hparam(spec, "classes", c.classes);
  return c;
}

}  // namespace nanscope
