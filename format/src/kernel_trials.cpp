#include "nanscope/format/kernel_trials.hpp"

#include <algorithm>
#include <array>

namespace nanscope::format {

namespace {

bool has(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// Attention's kernel in an op's name: the fused ops and the kernels inside
// them (aten::_flash_attention_forward on CUDA), the math path's composite;
// `unknown` for the op that chooses (aten::scaled_dot_product_attention),
// whose output the birth may name: every kernel is then tried.
std::optional<Kernel> attention_kernel(const std::string& op) {
  if (op == "aten::scaled_dot_product_attention") return Kernel::unknown;
  if (has(op, "flash_attention")) return Kernel::flash;
  if (has(op, "efficient_attention")) return Kernel::efficient;
  if (has(op, "cudnn_attention")) return Kernel::cudnn;
  if (has(op, "_scaled_dot_product_attention_math")) return Kernel::math;
  return std::nullopt;
}

// Ops that run through oneDNN on the CPU while it is on (bf16 and fp16
// matrix products, convolutions), and through PyTorch's own code when off.
bool onednn_op(const std::string& op) {
  static constexpr std::array<const char*, 16> kOps{"aten::convolution",
                                                    "aten::_convolution",
                                                    "aten::mkldnn_convolution",
                                                    "aten::conv1d",
                                                    "aten::conv2d",
                                                    "aten::conv3d",
                                                    "aten::conv_transpose1d",
                                                    "aten::conv_transpose2d",
                                                    "aten::conv_transpose3d",
                                                    "aten::addmm",
                                                    "aten::mm",
                                                    "aten::bmm",
                                                    "aten::baddbmm",
                                                    "aten::matmul",
                                                    "aten::linear",
                                                    "aten::mkldnn_linear"};
  return std::find(kOps.begin(), kOps.end(), op) != kOps.end();
}

}  // namespace

std::optional<KernelChoice> kernel_choice_of(const Birth& birth, bool cpu) {
  if (birth.op.phase == Phase::input) return std::nullopt;
  for (const std::string& op : {birth.op.op, birth.op.forward_op}) {
    if (const std::optional<Kernel> used = attention_kernel(op)) {
      KernelChoice c{op, *used, {}};
      const std::vector<Kernel> all =
          cpu || has(op, "_for_cpu")
              ? std::vector<Kernel>{Kernel::math, Kernel::flash}
              : std::vector<Kernel>{Kernel::math, Kernel::flash, Kernel::efficient, Kernel::cudnn};
      for (Kernel k : all)
        if (k != *used) c.others.push_back(k);
      return c;
    }
  }
  if (cpu && onednn_op(birth.op.op)) return KernelChoice{birth.op.op, Kernel::onednn, {Kernel::native}};
  return std::nullopt;
}

std::vector<Kernel> finite_kernels(const KernelTrials& trials) {
  std::vector<Kernel> out;
  for (const KernelTrial& t : trials.tried)
    if (t.outcome == KernelOutcome::finite) out.push_back(t.kernel);
  return out;
}

std::string kernel_trials_text(const KernelTrials& trials) {
  std::string text = trials.used == Kernel::unknown ? "the step's non-finite"
                                                    : std::string(to_string(trials.used)) + " non-finite (the step's)";
  for (const KernelTrial& t : trials.tried)
    text += std::string(", ") + to_string(t.kernel) + " " + to_string(t.outcome);
  return text;
}

Kernel kernel_to_pin(const KernelTrials& trials) {
  const std::vector<Kernel> finite = finite_kernels(trials);
  if (finite.empty()) return Kernel::unknown;
  return std::find(finite.begin(), finite.end(), Kernel::math) != finite.end() ? Kernel::math : finite.front();
}

namespace {

// LibTorch's switch for one kernel, and torch.backends' flag for it.
const char* cpp_switch(Kernel k) {
  switch (k) {
    case Kernel::math: return "setSDPUseMath";
    case Kernel::flash: return "setSDPUseFlash";
    case Kernel::efficient: return "setSDPUseMemEfficient";
    case Kernel::cudnn: return "setSDPUseCuDNN";
    default: return "";
  }
}

const char* python_backend(Kernel k) {
  switch (k) {
    case Kernel::math: return "MATH";
    case Kernel::flash: return "FLASH_ATTENTION";
    case Kernel::efficient: return "EFFICIENT_ATTENTION";
    case Kernel::cudnn: return "CUDNN_ATTENTION";
    default: return "";
  }
}

}  // namespace

std::string kernel_pin_code(Kernel good, const KernelTrials& trials, Origin origin) {
  const bool python = origin == Origin::python;
  if (good == Kernel::native)
    return python ? "torch.backends.mkldnn.enabled = False" : "at::globalContext().setUserEnabledMkldnn(false)";
  if (good == Kernel::onednn)
    return python ? "torch.backends.mkldnn.enabled = True" : "at::globalContext().setUserEnabledMkldnn(true)";
  if (python)
    return std::string("with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.") + python_backend(good) +
           "): around the model's forward";
  std::string code;
  std::vector<Kernel> others{trials.used};
  for (const KernelTrial& t : trials.tried) others.push_back(t.kernel);
  for (Kernel k : others)
    if (k != good && *cpp_switch(k))
      code += (code.empty() ? "" : "; ") + std::string("at::globalContext().") + cpp_switch(k) + "(false)";
  return code;
}

std::string kernel_trials_value(const KernelTrials& trials) {
  std::string value = std::string(to_string(trials.used)) + "=" + to_string(KernelOutcome::nonfinite);
  for (const KernelTrial& t : trials.tried)
    value += std::string(",") + to_string(t.kernel) + "=" + to_string(t.outcome);
  return value;
}

std::optional<KernelTrials> parse_kernel_trials(const std::string& op, const std::string& value) {
  KernelTrials trials;
  trials.op = op;
  size_t start = 0;
  bool first = true;
  while (start < value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    const std::string item = value.substr(start, end - start);
    const size_t eq = item.find('=');
    const Kernel kernel = from_string_or_unknown<Kernel>(item.substr(0, eq));
    const KernelOutcome outcome =
        eq == std::string::npos ? KernelOutcome::unknown : from_string_or_unknown<KernelOutcome>(item.substr(eq + 1));
    if (first)
      trials.used = kernel;
    else
      trials.tried.push_back({kernel, outcome});
    first = false;
    start = end + 1;
  }
  if (first) return std::nullopt;
  return trials;
}

}  // namespace nanscope::format
