#pragma once
// A step that does not count must leave the model as it found it. Skipping
// the optimizer step keeps the parameters and the optimizer state, but a
// forward has already written its buffers by then: BatchNorm's running mean,
// variance and counter, an EMA, a step counter. After a skipped NaN batch those
// hold NaN, and nothing in training shows it (train-mode BatchNorm uses the
// batch's own statistics): the model is sick at evaluation time. PyTorch's
// GradScaler has the same hole (pytorch/pytorch#88474).
//
// BufferTransaction copies, before each step, the buffers a forward writes,
// and puts them back when the step does not count. Which buffers a forward
// writes is learnt from the data, not guessed from module types: every buffer
// is copied until a step has counted; then those whose value and version did
// not change (a causal mask, position ids) are dropped from the copy, so a
// model whose forward writes nothing pays nothing. A dropped buffer that is
// written later (its version counter moves: every in-place op through autograd
// bumps it) is copied from then on; a write the version counter does not see
// (a kernel that updates its argument in place, as BatchNorm's does) is caught
// by the first step's value comparison. docs/recovery.md has the cost.
//
// A buffer may hold infinities on purpose: LLaMA-style attention registers an
// additive causal mask of -inf, a running maximum starts at -inf. The step's
// check counts only values the step made non-finite, so such a buffer is
// checked against its value before the step (WrittenBuffer::before).
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/model.hpp"

namespace nanscope {

// A floating buffer the forward may write, as the step checks it. `before` is
// its value before the step, set only for a buffer that held infinities of its
// own when the guard first saw it: there a value counts as non-finite only
// where the step changed it (any NaN, or a new infinity).
struct WrittenBuffer {
  at::Tensor buffer;
  at::Tensor before;
};

class BufferTransaction {
 public:
  // Before the step: copy the buffers a forward may write (on their device).
  void begin(const TrainableModel& model);
  // The step counted: learn from it which buffers the forward writes.
  void commit();
  // The step did not count: put the buffers it wrote back. Returns the names
  // of the buffers restored, and in `unrestorable` those written this step
  // that were not copied (first seen written now; copied from the next step).
  // The model's other models (a GAN's critic) keep what the step wrote unless
  // it made a buffer non-finite; that one is put back ("LABEL.name").
  std::vector<std::string> roll_back(std::vector<std::string>* unrestorable = nullptr);

  // The floating buffers a forward writes (or may, before the first commit):
  // the step checks them for non-finite values with its one host read.
  const std::vector<WrittenBuffer>& written_floating() const { return written_floating_; }
  // Names of the buffers copied before each step.
  std::vector<std::string> copied_names() const;
  // Bytes copied before each step.
  int64_t copied_bytes() const;

 private:
  enum class Role : uint8_t { unknown, written, constant };
  struct Slot {
    std::string name;
    at::Tensor buffer;  // the model's own tensor
    at::Tensor copy;    // its value before the step (unknown and written slots)
    int64_t version = 0;
    Role role = Role::unknown;
    bool own_infinities = false;  // held non-finite values when first seen (a mask)
  };
  bool copies(const Slot& s) const { return s.role != Role::constant; }
  void rebind(const TrainableModel& model);
  void refresh_written_floating();

  struct OtherSlot {
    std::string name;  // "LABEL.name"
    at::Tensor buffer, copy;
  };
  std::vector<Slot> slots_;
  std::vector<OtherSlot> others_;  // other models' floating buffers, copied at each step's start
  std::vector<WrittenBuffer> written_floating_;
};

// Keeps every buffer of a model (and of the other models its loss runs) as
// it is now and puts them back when it goes out of scope: around a re-run of
// a step (the forensic re-run, replay's re-runs), which must leave no trace.
class KeepBuffers {
 public:
  explicit KeepBuffers(const TrainableModel& model);
  ~KeepBuffers();
  KeepBuffers(const KeepBuffers&) = delete;
  KeepBuffers& operator=(const KeepBuffers&) = delete;

  // 1 where the re-run wrote a NaN/Inf into a floating buffer (BatchNorm's
  // running_var of a batch whose variance overflows: the forward's output and
  // the loss stay finite), against the value kept, so a mask's own -inf does
  // not count; on the device, undefined when there are no floating buffers.
  at::Tensor turned_nonfinite() const;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;  // (the buffer, its value)
};

}  // namespace nanscope
