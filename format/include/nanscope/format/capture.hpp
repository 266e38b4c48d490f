#pragma once
// What op-level capture found, as plain data: the first NaN and Inf births and
// the trail of ops before them. Written into snapshots under /capture and read
// back by replay and the viewer (schema: docs/format.md).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

// Summary of one tensor (or scalar) an op read or wrote.
struct TensorStats {
  std::string dtype;  // "float32", "bfloat16", "scalar", ...
  std::vector<int64_t> shape;
  double min = 0, max = 0, absmax = 0;  // over the finite values
  int64_t nan_count = 0, inf_count = 0;
};

// One op as capture saw it.
struct OpRecord {
  int64_t index = 0;  // execution order within the captured step
  std::string op;     // "aten::log"
  Phase phase = Phase::forward;
  std::string module;         // dotted path; "" is the root
  std::string backward_node;  // "SqrtBackward0" for ops inside an autograd node (or its hooks)
  // The forward op that made that node (via seqNr): an aten op, or a custom
  // autograd Function's name ("GradPoison" for GradPoisonBackward).
  std::string forward_op;
  int64_t seq_nr = -1;
  TensorStats output;        // the first floating output
  OpSite site = OpSite::op;  // a gradient hook's op, or one a recomputation ran
};

// Where a NaN or an Inf was born (docs/design.md: "first birth").
struct Birth {
  OpRecord op;
  BirthKind kind = BirthKind::nan;
  int64_t sample = -1;  // the batch row, for an input birth; -1 otherwise
  // An input birth in a batch of named tensors: the one that holds it
  // ("pixel_values", "[0]"); "" when unnamed (an (inputs, targets) batch).
  std::string input;
  // A step of several micro-batches (gradient accumulation): the one this
  // birth happened in, from 0; its rows are rows of that micro-batch. -1: the
  // step had one batch.
  int64_t micro_batch = -1;
  // For a birth inside the model whose output's first dimension is the batch:
  // the batch rows (positions in the batch) that went non-finite at this op,
  // the first 16 of them. Names the sample where batch bisection cannot run.
  std::vector<int64_t> rows;
  // For a loss with an ignore_index (cross_entropy, nll_loss): the targets it
  // counted. 0 means every target was ignored and its mean was 0 / 0. -1: not
  // such an op, or a file from before this was recorded.
  int64_t counted_targets = -1;
  std::vector<TensorStats> inputs;  // the birth op's floating inputs, as they were at its start
};

// The one wording of a birth, for logs, events, reports and the viewer:
// "nan at aten::log (forward) in module 'blocks.0.mlp'",
// "inf at aten::div (backward, in SqrtBackward0 of aten::sqrt) in module 'attn'",
// "nan at aten::div (backward, in a gradient hook at MulBackward0 of aten::mul) in module 'norm'",
// "inf at aten::div (backward, in SqrtBackward0 of aten::sqrt, recomputed) in module 'norm'",
// "nan at input (input) in module '', batch row 5", with ", micro-batch 3"
// before the row in a step of several micro-batches, and the tensor named
// where the batch names its tensors ("nan at input 'pixel_values' (input) ...");
// before the row in a step of several micro-batches; an internal birth whose
// output went non-finite in some batch rows only names them the same way.
std::string birth_text(const Birth& birth);
// Where in the step's batch: "micro-batch 3, batch row 5", "batch rows 2, 7";
// "" when the birth names no micro-batch or row.
std::string birth_place_text(const Birth& birth);

struct Capture {
  bool reproduced = false;  // the re-run produced a non-finite value
  int64_t ops_seen = 0;
  // A compiled model's step (torch.compile) that the eager re-run found
  // finite and the compiled program made non-finite again: the compiler's
  // doing, not the model's math (core/compiled_region.hpp).
  bool compiled_only = false;
  // The module that, compiled alone, makes the step non-finite; "" when only
  // the whole model compiled does; nullopt when not searched.
  std::optional<std::string> compiled_region;
  std::optional<Birth> first_birth, first_nan_birth, first_inf_birth;
  std::vector<OpRecord> trail;  // the last ops up to and including the first birth
  // Births before the one reported whose values never reached what the step
  // failed on (every later op discarded them), and a non-finite batch leaf
  // the step did not read: notes, never the birth (birth_text, at most 4).
  std::vector<std::string> discarded;
  // The batch holds a NaN/Inf the step's failed values never came from (a
  // leaf it did not read): the batch is not the cause (its note is in discarded).
  bool batch_not_read = false;
  // The parameters that held a NaN/Inf as the step began: the value was born
  // before it (an update, or the weights as loaded), so no op of this step
  // is its birth and no re-run from them names one; none was run.
  std::vector<std::string> nonfinite_weights;
};

// birth_text of the first birth, or why there is none: "not reproduced on
// re-run (transient)", "non-finite again on re-run, but no op was seen making
// it (...)", "the forensic re-run failed", "finite when run eagerly,
// non-finite compiled (...)", "born before this step: its weights held ...".
std::string capture_text(const Capture& capture);

// "parameter a, parameter b, parameter c and 2 more": weights held NaN/Inf
// as a step began (Capture::nonfinite_weights), as births and verdicts name them.
std::string weights_text(const std::vector<std::string>& names);

void write_capture(const Group& group, const Capture& capture);
// Throws FormatError naming the file for a missing or malformed /capture.
Capture read_capture(const Group& group);

}  // namespace nanscope::format
