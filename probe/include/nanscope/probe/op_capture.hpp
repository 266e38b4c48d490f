#pragma once
// Op-level capture: while an OpCapture is alive, a global RecordFunction
// callback sees every aten op, forward and backward, on every thread, and
// finds the first NaN birth and the first Inf birth (docs/design.md):
//  - a NaN is born at an op whose output holds a NaN while none of its
//    floating inputs (tensors and scalars) held one;
//  - an Inf is born at an op whose output holds +-Inf while all its floating
//    inputs were finite, or, for an elementwise op with no infinite scalar
//    input, at a position where all its inputs were finite (exp overflowing
//    beside a causal mask's -inf);
//  - inputs are judged as they were when the op started (in-place ops);
//  - a forward op that writes a NaN/Inf into an input no gradient flows
//    through (a buffer) without returning it (BatchNorm's running_var) holds
//    it as an output;
//  - when a composite op and the op inside it both qualify, the outer one
//    (what the model's code called) is reported;
//  - the birth reported is the first whose values reach what the step failed
//    on: the capture follows each non-finite value from op to op (by the
//    storage it lives in), and a birth whose values every later op discarded
//    (a where() or a mask that drops them, a cast to an integer type, a max
//    that ignores them) is only a note (Capture::discarded). Where the step
//    did not say what failed (note_step_result), or none of its values can be
//    followed back to a birth, the first birth is reported.
// Ops are the step's when they run on the thread that made the capture, or in
// the backward on any thread (the autograd engine's); another thread's (a data
// loader's workers) are not seen.
// Backward ops carry their autograd node's name and are named by the module
// whose forward made the node, whatever made it (an aten op, a custom autograd
// Function, a view): each node's sequence number is matched to the op and
// module running when it was taken. An op of a hook the engine runs before a
// node (tensor.register_hook) is that node's, with site gradient_hook; a
// module's forward run again inside the backward (activation checkpointing) is
// a forward op with site recomputation. A backward op's rows are named as a
// forward op's are.
//
// Costly by design (every op's floating inputs and outputs are checked with a
// reduction and a host copy; pure view ops are skipped): it runs on the
// forensic re-run, or every step when asked for. Full statistics are computed
// for births at once, and for the trail when result() is called (a trail
// op's output changed in place later shows its later values).
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "nanscope/format/capture.hpp"

namespace nanscope::probe {

// Sees each outermost op (no other op of the step runs around it) as it ends:
// its record (its module as far as known by then; no output stats) and its
// first floating output. What the precision trail compares (precision_trail.hpp).
using OpOutputSink = std::function<void(const format::OpRecord&, const at::Tensor&)>;

struct CaptureOptions {
  size_t trail_length = 32;  // ops kept before (and including) the first birth
  // The step's batch size: a birth (forward or backward) whose output's
  // dimension row_dim is this records which rows went non-finite
  // (Birth::rows). -1: not recorded.
  int64_t batch_size = -1;
  int64_t row_dim = 0;       // the samples' dimension ((seq, batch) data: 1)
  int64_t micro_batch = -1;  // births carry it (Birth::micro_batch); -1: a step of one batch
};

class OpCapture {
 public:
  // `on_op_output`, when set, is handed each outermost op's output.
  explicit OpCapture(CaptureOptions options = {}, OpOutputSink on_op_output = {});
  ~OpCapture();  // removes the callback
  OpCapture(const OpCapture&) = delete;
  OpCapture& operator=(const OpCapture&) = delete;

  // What was seen so far; `reproduced` is true when any op output was non-finite.
  format::Capture result() const;
  // The module paths whose scopes forward ops ran in, in first-seen order
  // ("" excluded): what an fp32 region can switch.
  std::vector<std::string> modules_seen() const;
  // A step of several micro-batches re-runs them one after another under one
  // capture: births from here on belong to this micro-batch and its rows.
  void begin_micro_batch(int64_t index, int64_t batch_size, int64_t row_dim);
  // Whether what the step failed on holds values of its batch (a non-finite
  // leaf the step read); nullopt where the step said of no failed value, or
  // its failed values came only from where the capture cannot follow.
  std::optional<bool> failure_read_batch() const;
};

// What a step re-run under an active capture starts from and ends with; no-ops
// without one (nothing on a step that is not captured). The step's batch
// leaves, before its forward: a non-finite one is followed like a birth's
// values. The values it failed on, after its backward (the loss, the
// gradients, their norm): the births whose values reached them are the ones
// reported.
void note_step_batch(const std::vector<at::Tensor>& leaves);
void note_step_result(const std::vector<at::Tensor>& values);

}  // namespace nanscope::probe
