#include "nanscope/format/advice_words.hpp"

namespace nanscope::format {

namespace {

// nanscope-train's user sets flags and the library's user GuardOptions
// fields, both around LibTorch's C++ API; the Python module's user sets
// keyword arguments and writes torch's Python.
constexpr AdviceWords kTrainWords{
    "train with",
    "--act-absmax-every N",
    "--amp bf16",
    "--fallback auto",
    "--probe off",
    "--doom-search on",
    "--fp32-modules ",
    "",
    ",",
    "",
    "torch::log_softmax",
    "torch::nn::functional::cross_entropy",
    "torch::nn::functional::logsigmoid",
    "torch::nn::functional::binary_cross_entropy_with_logits",
    "torch::softmax",
    "torch::logsumexp",
    "torch::nn::functional::softplus",
    "TORCH_CHECK(torch::isfinite(x).all().item<bool>(), \"non-finite sample \", i)",
    "nanscope-replay ",
    "",
};

constexpr AdviceWords kCppWords{
    "set",
    "GuardOptions::act_absmax_every = N",
    "GuardOptions::amp = nanscope::Amp::bf16",
    "GuardOptions::fallback = nanscope::FallbackMode::automatic",
    "GuardOptions::probe = false",
    "GuardOptions::doom_search.enabled = true",
    "GuardOptions::fp32_modules = {",
    "\"",
    ", ",
    "}",
    kTrainWords.log_softmax,
    kTrainWords.cross_entropy,
    kTrainWords.logsigmoid,
    kTrainWords.bce_with_logits,
    kTrainWords.softmax,
    kTrainWords.logsumexp,
    kTrainWords.softplus,
    kTrainWords.check_finite,
    "YOUR_TRAINING_PROGRAM ",
    " (a program that calls nanscope::replay::replay_main with your model and loss)",
};

constexpr AdviceWords kPythonWords{
    "use",
    "nanscope.GuardConfig(act_absmax_every=N)",
    "nanscope.StepGuard(..., amp=\"bf16\")",
    "nanscope.GuardConfig(fallback=\"auto\")",
    "nanscope.GuardConfig(probe=False)",
    "nanscope.GuardConfig(doom_search=True)",
    "nanscope.GuardConfig(fp32_modules=[",
    "\"",
    ", ",
    "])",
    "torch.log_softmax",
    "F.cross_entropy",
    "F.logsigmoid",
    "F.binary_cross_entropy_with_logits",
    "torch.softmax",
    "torch.logsumexp",
    "F.softplus",
    "assert torch.isfinite(x).all(), f\"non-finite sample {i}\"",
    "python3 -m nanscope replay ",
    " --model MODULE:FACTORY --loss MODULE:LOSS_FN",
};

}  // namespace

const AdviceWords& advice_words(Origin origin) {
  // No default: a new origin draws -Wswitch here until it has its row.
  switch (origin) {
    case Origin::cpp: return kCppWords;
    case Origin::python: return kPythonWords;
    case Origin::nanscope_train:
    case Origin::unknown: break;
  }
  return kTrainWords;
}

std::string fp32_modules_setting(Origin origin, const std::vector<std::string>& modules) {
  const AdviceWords& w = advice_words(origin);
  std::string out = w.fp32_modules_open;
  for (size_t i = 0; i < modules.size(); ++i)
    out += (i ? w.fp32_modules_separator : "") + std::string(w.fp32_modules_quote) + modules[i] + w.fp32_modules_quote;
  return out + w.fp32_modules_close;
}

std::string how_to_set(Origin origin, const std::string& setting) {
  return std::string(advice_words(origin).set) + " " + setting;
}

std::string replay_command(Origin origin, const std::string& snapshot, const std::string& python) {
  const AdviceWords& w = advice_words(origin);
  std::string before = w.replay_before;
  // A Python run is replayed by the interpreter that trained it: under pyenv,
  // conda or a venv the first python3 on PATH may have no torch.
  if (origin == Origin::python && !python.empty()) {
    const bool plain = python.find_first_of(" '\"\\$") == std::string::npos;
    before = (plain ? python : "'" + python + "'") + before.substr(before.find(' '));
  }
  return before + snapshot + w.replay_after;
}

}  // namespace nanscope::format
