#include "nanscope/models/gpt.hpp"

#include <c10/core/GradMode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cmath>
#include <stdexcept>

#include "nanscope/models/fault_ops.hpp"
#include "nanscope/models/sample_model.hpp"
#include "nanscope/probe/module_scope.hpp"

namespace nanscope {

namespace {

namespace F = torch::nn::functional;

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const GptConfig& c) : n_head(c.n_head) {
    qkv = register_module("qkv", torch::nn::Linear(c.n_embd, 3 * c.n_embd));
    proj = register_module("proj", torch::nn::Linear(c.n_embd, c.n_embd));
  }
  at::Tensor forward(const at::Tensor& x, FaultKind fault, double fault_arg) {
    NANSCOPE_MODULE_SCOPE("attn");
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / n_head;
    at::Tensor packed;
    {
      NANSCOPE_MODULE_SCOPE("qkv");
      packed = qkv(x);
    }
    auto parts = packed.split(C, /*dim=*/2);
    at::Tensor q = parts[0].view({B, T, n_head, hd}).transpose(1, 2);
    at::Tensor k = parts[1].view({B, T, n_head, hd}).transpose(1, 2);
    at::Tensor v = parts[2].view({B, T, n_head, hd}).transpose(1, 2);
    if (fault == FaultKind::sqrt_grad_zero) q = fault_ops::add_rms_of_zeros(q);
    if (fault == FaultKind::attention_logit_growth) q = q * fault_arg;
    at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
    // Future positions get -inf before the softmax: an intended -inf, not a fault.
    at::Tensor future = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
    if (fault == FaultKind::masked_row) future = fault_ops::mask_row_zero_completely(future);
    att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
    att = at::softmax(att, -1);
    at::Tensor y = at::matmul(att, v).transpose(1, 2).reshape({B, T, C});
    NANSCOPE_MODULE_SCOPE("proj");
    return proj(y);
  }
  int64_t n_head;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : torch::nn::Module {
  MlpImpl(const GptConfig& c) {
    fc = register_module("fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd));
    proj = register_module("proj", torch::nn::Linear(4 * c.n_embd, c.n_embd));
  }
  at::Tensor forward(const at::Tensor& x, FaultKind fault) {
    NANSCOPE_MODULE_SCOPE("mlp");
    at::Tensor h;
    {
      NANSCOPE_MODULE_SCOPE("fc");
      h = fc(x);
    }
    if (fault == FaultKind::activation_overflow) h = fault_ops::blow_up_activation(h);
    h = F::gelu(h);
    if (fault == FaultKind::log_nonpositive) h = fault_ops::log_of_activation(h);
    NANSCOPE_MODULE_SCOPE("proj");
    return proj(h);
  }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GptConfig& c, int64_t index) : path("blocks." + std::to_string(index)) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    attn = register_module("attn", Attention(c));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    mlp = register_module("mlp", Mlp(c));
  }
  at::Tensor forward(at::Tensor x, FaultKind fault, double fault_arg) {
    NANSCOPE_MODULE_SCOPE(path.c_str());
    at::Tensor h;
    {
      NANSCOPE_MODULE_SCOPE("ln1");
      if (fault == FaultKind::zero_variance_norm)
        h = fault_ops::layer_norm_without_eps_on_constant_row(x, ln1->weight, ln1->bias);
      else if (fault == FaultKind::variance_cancellation)
        h = fault_ops::layer_norm_by_cancellation(x, ln1->weight, ln1->bias);
      else
        h = ln1(x);
    }
    x = x + attn->forward(h, fault, fault_arg);
    {
      NANSCOPE_MODULE_SCOPE("ln2");
      h = ln2(x);
    }
    return x + mlp->forward(h, fault);
  }
  std::string path;  // "blocks.N", as named_modules() names it
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& c) : config(c) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab_size, c.n_embd));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(c.seq_len, c.n_embd));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(Block(c, i));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
    head = register_module("head", torch::nn::Linear(c.n_embd, c.vocab_size));
    init_weights();
  }
  // GPT-2 initialisation (P17): N(0, 0.02), residual projections scaled by
  // 1/sqrt(2 n_layer), zero biases.
  void init_weights() {
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * double(config.n_layer));
    for (const auto& item : named_parameters()) {
      const std::string& name = item.key();
      at::Tensor p = item.value();
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0)
        p.zero_();
      else if (name.find("ln") != std::string::npos)
        p.fill_(1.0);
      else if (name.find(".proj.weight") != std::string::npos)
        p.normal_(0.0, residual_std);
      else
        p.normal_(0.0, 0.02);
    }
  }
  at::Tensor logits(const at::Tensor& idx, FaultKind fault, double fault_arg) {
    const int64_t T = idx.size(1);
    if (T > config.seq_len)
      throw std::invalid_argument("sequence of " + std::to_string(T) + " tokens exceeds seq_len " +
                                  std::to_string(config.seq_len));
    at::Tensor pos = at::arange(T, idx.options().dtype(at::kLong));
    at::Tensor x;
    {
      NANSCOPE_MODULE_SCOPE("tok_emb");
      x = tok_emb(idx);
    }
    {
      NANSCOPE_MODULE_SCOPE("pos_emb");
      x = x + pos_emb(pos);
    }
    for (size_t i = 0; i < blocks->size(); ++i) {
      // Faults live in block 0 only, so their module is known: blocks.0.*.
      x = blocks->ptr(i)->as<Block>()->forward(x, i == 0 ? fault : FaultKind::none, fault_arg);
    }
    {
      NANSCOPE_MODULE_SCOPE("ln_f");
      x = ln_f(x);
    }
    NANSCOPE_MODULE_SCOPE("head");
    if (fault == FaultKind::logit_drift) x = x * fault_arg;
    return head(x);
  }
  GptConfig config;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);

class GptModel : public SampleModel {
 public:
  explicit GptModel(Gpt gpt) : SampleModel(gpt.ptr()), gpt_(std::move(gpt)) {}
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    if (inputs.scalar_type() != at::kLong || inputs.dim() != 2)
      throw std::invalid_argument("gpt expects int64 token inputs of shape [batch, seq]");
    return lm_loss(gpt_->logits(inputs, fault_, fault_arg_), targets);
  }
  ModelSpec spec() const override {
    const GptConfig& c = gpt_->config;
    return {"gpt",
            {{"vocab_size", c.vocab_size},
             {"seq_len", c.seq_len},
             {"n_layer", c.n_layer},
             {"n_head", c.n_head},
             {"n_embd", c.n_embd}},
            {}};
  }

 private:
  Gpt gpt_;
};

}  // namespace

std::unique_ptr<TrainableModel> make_gpt(const GptConfig& c, uint64_t seed) {
  if (c.n_layer < 1 || c.n_head < 1 || c.n_embd < 1 || c.seq_len < 1 || c.vocab_size < 2)
    throw std::invalid_argument("gpt sizes must be positive");
  if (c.n_embd % c.n_head != 0)
    throw std::invalid_argument("gpt n_embd (" + std::to_string(c.n_embd) + ") must be a multiple of n_head (" +
                                std::to_string(c.n_head) + ")");
  torch::manual_seed(seed);
  return std::make_unique<GptModel>(Gpt(c));
}

GptConfig gpt_config_from(const ModelSpec& spec) {
  GptConfig c;
  read_hparam(spec, "vocab_size", c.vocab_size);
  read_hparam(spec, "seq_len", c.seq_len);
  read_hparam(spec, "n_layer", c.n_layer);
  read_hparam(spec, "n_head", c.n_head);
  read_hparam(spec, "n_embd", c.n_embd);
  return c;
}

}  // namespace nanscope
