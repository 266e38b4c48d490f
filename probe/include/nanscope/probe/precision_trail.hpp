#pragma once
// The precision trail's two runs (format/precision_trail.hpp): the step at its
// low precision under an OpCapture whose on_op_output is low_precision_run(),
// then in fp32 under one whose on_op_output is fp32_run(). The first keeps
// each outermost op's output (up to a memory budget, and no further than the
// first op whose output holds a NaN); the second pairs each fp32 op with the
// next kept op of the same name, phase, module, node and shape, and measures
// the difference, keeping nothing of its own. Ops of one run only (the casts
// autocast or the model adds at low precision) are stepped over.
// Replay and diagnosis only: it keeps and compares every op's output.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "nanscope/format/precision_trail.hpp"
#include "nanscope/probe/op_capture.hpp"

namespace nanscope::probe {

class PrecisionTrailRecorder {
 public:
  static constexpr size_t kDefaultBudgetBytes = size_t(512) << 20;
  // `low`: the type errors are counted in (bfloat16, float16). `loss_scale`:
  // what the low-precision run's backward was scaled by (an fp16 step's;
  // 1 otherwise): its backward outputs are divided by it before they are
  // compared (a gradient is linear in the loss).
  PrecisionTrailRecorder(at::ScalarType low, double loss_scale, size_t budget_bytes = kDefaultBudgetBytes);

  OpOutputSink low_precision_run();
  OpOutputSink fp32_run();

  // The ops compared up to and including op `birth_index` of the
  // low-precision run (its capture's first birth; -1: every op kept), or the
  // outermost op around it.
  format::PrecisionTrail result(int64_t birth_index) const;

 private:
  struct Kept {
    format::OpRecord op;
    at::Tensor output;
    std::optional<format::OpError> error;  // set when an fp32 op was paired with it
  };
  void keep(const format::OpRecord& op, const at::Tensor& output);
  void compare(const format::OpRecord& op, const at::Tensor& output);

  at::ScalarType low_;
  double loss_scale_;
  size_t budget_, bytes_ = 0;
  std::vector<Kept> kept_;
  bool keeping_ = true;
  int64_t budget_ran_out_at_ = -1;  // the low run's op index where keeping stopped for memory
  size_t next_ = 0;                 // the first kept op not yet paired or stepped over
};

}  // namespace nanscope::probe
