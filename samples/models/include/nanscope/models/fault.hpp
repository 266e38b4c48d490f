#pragma once
// Planted faults (--fault KIND@STEP[:ARG][/rankR]): one per arithmetic origin of a NaN
// in the playbook (P8/P11/P12), placed at a known op and module so a
// test can check that the run survives it and, later, that the probe finds it.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace nanscope {

enum class FaultKind {
  none,
  nonfinite_input,         // P11: a NaN written into the batch (ARG: the sample row, default 0)
  log_nonpositive,         // P8: log of the GELU output in blocks.0.mlp (negative values)
  sqrt_grad_zero,          // P8: sqrt of an all-zero RMS in blocks.0.attn: finite forward, Inf backward
  zero_variance_norm,      // P8: blocks.0.ln1 without eps on a constant row: 0/0
  exp_overflow,            // P8: hand-rolled softmax in head: exp of large logits overflows
  lr_spike,                // P12: LR x ARG (default 1000) from STEP on
  masked_row,              // a fully masked attention row in blocks.0.attn: softmax over all -inf
  variance_cancellation,   // P10 (bf16-only): variance as E[x^2]-E[x]^2 by matmul in blocks.0.ln1
  activation_overflow,     // P10 (fp16-only): blocks.0.mlp's pre-activation passes 65504
  attention_logit_growth,  // P16: blocks.0.attn's queries x ARG (default 1e6): past fp16's range
  logit_drift,             // P15: the head's input x ARG (default 1e6): past fp16's range
  lr_ramp,                 // P12, slow onset: LR x (1 + ARG)^(step - STEP) from STEP on (default 0.2)
  input_ramp,              // slow onset: float inputs x (1 + ARG)^(step - STEP) from STEP on (default 0.3)
  sample_burst,            // finite but huge samples: float inputs and targets x ARG (default 1e4), kBurstSteps steps
  lr_pulse,                // P12, one step: LR x ARG (default 1000) at STEP alone: a finite update that may
                           // doom a later step (a schedule bug, a resumed run's LR)
  buffer_nan,              // after STEP's update, NaN is written into the model's first floating buffer: a
                           // state that went sick outside any step (a bug in the loop, a bad load)
  corrupt_sample,          // from STEP on, data set row ARG reads as NaN wherever a batch holds it: a corrupt
                           // record, met again every epoch
};

// How many steps a sample_burst lasts.
inline constexpr int64_t kBurstSteps = 8;

struct Fault {
  FaultKind kind = FaultKind::none;
  int64_t step = 0;
  double arg = 0;  // the row for nonfinite_input, the factor for lr_spike
  int rank = -1;   // multi-process runs: planted on this rank only (-1: every rank)
};

const char* fault_name(FaultKind kind);
// Parses KIND@STEP[:ARG][/rankR]; throws std::invalid_argument with a readable message.
Fault parse_fault(const std::string& text);
// The faults this rank plants (those for every rank and those for it), with
// the rank dropped: what the rank's run config and snapshots record, so a
// snapshot replays on one process with exactly the faults its rank had.
std::vector<Fault> faults_on_rank(const std::vector<Fault>& faults, int rank);
std::vector<std::string> fault_kind_names();

// Faults the training loop plants (in the data or the LR), not the model.
bool is_loop_fault(FaultKind kind);
// The fault (kind none if any) planted inside the model at `step`.
Fault model_fault_at(const std::vector<Fault>& faults, int64_t step);
// The LR multiplier in force at `step` (lr_spike persists once it fires).
double lr_multiplier_at(const std::vector<Fault>& faults, int64_t step);
// The factor the float inputs are multiplied by at `step` (input_ramp, sample_burst), 1 without.
double input_scale_at(const std::vector<Fault>& faults, int64_t step);
// The factor float targets are multiplied by at `step` (sample_burst), 1 without.
double target_scale_at(const std::vector<Fault>& faults, int64_t step);
// Whether buffer_nan is planted after `step`.
bool buffer_poisoned_after(const std::vector<Fault>& faults, int64_t step);
// The batch row to poison at `step`, if nonfinite_input is planted there.
std::optional<int64_t> poisoned_row_at(const std::vector<Fault>& faults, int64_t step);
// corrupt_sample: the data set rows that read as NaN at `step`.
std::vector<int64_t> corrupt_rows_at(const std::vector<Fault>& faults, int64_t step);

}  // namespace nanscope
