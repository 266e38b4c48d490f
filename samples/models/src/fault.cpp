#include "nanscope/models/fault.hpp"

#include <cmath>
#include <stdexcept>

namespace nanscope {

namespace {

constexpr FaultKind kKinds[] = {FaultKind::nonfinite_input,
                                FaultKind::log_nonpositive,
                                FaultKind::sqrt_grad_zero,
                                FaultKind::zero_variance_norm,
                                FaultKind::exp_overflow,
                                FaultKind::lr_spike,
                                FaultKind::masked_row,
                                FaultKind::variance_cancellation,
                                FaultKind::activation_overflow,
                                FaultKind::attention_logit_growth,
                                FaultKind::logit_drift,
                                FaultKind::lr_ramp,
                                FaultKind::input_ramp,
                                FaultKind::sample_burst,
                                FaultKind::lr_pulse,
                                FaultKind::buffer_nan,
                                FaultKind::corrupt_sample};

double default_arg(FaultKind kind) {
  switch (kind) {
    case FaultKind::lr_spike:
    case FaultKind::lr_pulse: return 1000.0;
    case FaultKind::attention_logit_growth:
    case FaultKind::logit_drift: return 1e6;
    case FaultKind::lr_ramp: return 0.2;
    case FaultKind::input_ramp: return 0.3;
    case FaultKind::sample_burst: return 1e4;
    default: return 0.0;
  }
}

}  // namespace

const char* fault_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::none: return "none";
    case FaultKind::nonfinite_input: return "nonfinite_input";
    case FaultKind::log_nonpositive: return "log_nonpositive";
    case FaultKind::sqrt_grad_zero: return "sqrt_grad_zero";
    case FaultKind::zero_variance_norm: return "zero_variance_norm";
    case FaultKind::exp_overflow: return "exp_overflow";
    case FaultKind::lr_spike: return "lr_spike";
    case FaultKind::masked_row: return "masked_row";
    case FaultKind::variance_cancellation: return "variance_cancellation";
    case FaultKind::activation_overflow: return "activation_overflow";
    case FaultKind::attention_logit_growth: return "attention_logit_growth";
    case FaultKind::logit_drift: return "logit_drift";
    case FaultKind::lr_ramp: return "lr_ramp";
    case FaultKind::input_ramp: return "input_ramp";
    case FaultKind::sample_burst: return "sample_burst";
    case FaultKind::lr_pulse: return "lr_pulse";
    case FaultKind::buffer_nan: return "buffer_nan";
    case FaultKind::corrupt_sample: return "corrupt_sample";
  }
  return "?";
}

std::vector<std::string> fault_kind_names() {
  std::vector<std::string> names;
  for (FaultKind k : kKinds) names.emplace_back(fault_name(k));
  return names;
}

Fault parse_fault(const std::string& text) {
  const auto at = text.find('@');
  if (at == std::string::npos)
    throw std::invalid_argument("fault '" + text + "' must look like KIND@STEP[:ARG][/rankR]");
  const std::string name = text.substr(0, at);
  std::string rest = text.substr(at + 1);
  std::string rank;
  if (const auto slash = rest.find("/rank"); slash != std::string::npos) {
    rank = rest.substr(slash + 5);
    rest = rest.substr(0, slash);
  }
  std::string arg;
  if (const auto colon = rest.find(':'); colon != std::string::npos) {
    arg = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
  }
  Fault fault;
  for (FaultKind k : kKinds)
    if (name == fault_name(k)) fault.kind = k;
  if (fault.kind == FaultKind::none) {
    std::string known;
    for (const auto& n : fault_kind_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown fault kind '" + name + "' (known: " + known + ")");
  }
  try {
    size_t used = 0;
    fault.step = std::stoll(rest, &used);
    if (used != rest.size() || fault.step < 0) throw std::invalid_argument("");
    fault.arg = default_arg(fault.kind);
    if (!arg.empty()) fault.arg = std::stod(arg, &used);
    if (!arg.empty() && used != arg.size()) throw std::invalid_argument("");
    if (!rank.empty()) fault.rank = std::stoi(rank, &used);
    if (!rank.empty() && (used != rank.size() || fault.rank < 0)) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::invalid_argument("fault '" + text +
                                "': STEP must be a step number >= 0, ARG a number and RANK (after /rank) a rank >= 0");
  }
  return fault;
}

std::vector<Fault> faults_on_rank(const std::vector<Fault>& faults, int rank) {
  std::vector<Fault> mine;
  for (Fault f : faults)
    if (f.rank < 0 || f.rank == rank) {
      f.rank = -1;  // from here on, "this process"
      mine.push_back(f);
    }
  return mine;
}

bool is_loop_fault(FaultKind kind) {
  return kind == FaultKind::lr_spike || kind == FaultKind::lr_pulse || kind == FaultKind::nonfinite_input ||
         kind == FaultKind::lr_ramp || kind == FaultKind::input_ramp || kind == FaultKind::sample_burst ||
         kind == FaultKind::buffer_nan || kind == FaultKind::corrupt_sample;
}

Fault model_fault_at(const std::vector<Fault>& faults, int64_t step) {
  for (const auto& f : faults)
    if (f.step == step && !is_loop_fault(f.kind)) return f;
  return Fault{};
}

double lr_multiplier_at(const std::vector<Fault>& faults, int64_t step) {
  double m = 1.0;
  for (const auto& f : faults)
    if ((f.kind == FaultKind::lr_spike && step >= f.step) || (f.kind == FaultKind::lr_pulse && step == f.step))
      m *= f.arg;
    else if (f.kind == FaultKind::lr_ramp && step >= f.step)
      m *= std::pow(1.0 + f.arg, double(step - f.step));
  return m;
}

double input_scale_at(const std::vector<Fault>& faults, int64_t step) {
  double m = 1.0;
  for (const auto& f : faults)
    if (f.kind == FaultKind::input_ramp && step >= f.step)
      m *= std::pow(1.0 + f.arg, double(step - f.step));
    else if (f.kind == FaultKind::sample_burst && step >= f.step && step < f.step + kBurstSteps)
      m *= f.arg;
  return m;
}

double target_scale_at(const std::vector<Fault>& faults, int64_t step) {
  double m = 1.0;
  for (const auto& f : faults)
    if (f.kind == FaultKind::sample_burst && step >= f.step && step < f.step + kBurstSteps) m *= f.arg;
  return m;
}

bool buffer_poisoned_after(const std::vector<Fault>& faults, int64_t step) {
  for (const auto& f : faults)
    if (f.kind == FaultKind::buffer_nan && f.step == step) return true;
  return false;
}

std::vector<int64_t> corrupt_rows_at(const std::vector<Fault>& faults, int64_t step) {
  std::vector<int64_t> rows;
  for (const auto& f : faults)
    if (f.kind == FaultKind::corrupt_sample && step >= f.step) rows.push_back(static_cast<int64_t>(f.arg));
  return rows;
}

std::optional<int64_t> poisoned_row_at(const std::vector<Fault>& faults, int64_t step) {
  for (const auto& f : faults)
    if (f.kind == FaultKind::nonfinite_input && f.step == step) return static_cast<int64_t>(f.arg);
  return std::nullopt;
}

}  // namespace nanscope
