#pragma once
// Where the default CPU generator stood when a step or a micro-batch began:
// what lets a re-run draw the same numbers (dropout masks) again.
//
// The generator's own get_state() allocates two blocks of about 5 KB each.
// On a small model those are the largest allocations of a clean guarded
// step. glibc consolidates the memory the previous step's graph freed at the
// first such allocation, and that costs about 40 us on a 10 ms step. The plain
// loop pays it in its forward; a guard that allocated first would pay it in
// its own calls. So a state is kept as the generator's engine by value, in
// memory reused from step to step (take_now), and turned into get_state()'s
// bytes only when a snapshot asks for them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace nanscope {

class CpuRngState {
 public:
  CpuRngState() = default;  // none known: a re-run draws from the generator as it stands
  // The default generator's state now.
  static CpuRngState now();
  // get_state()'s bytes, as a snapshot holds them; undefined bytes: none known.
  static CpuRngState from_bytes(const at::Tensor& bytes);

  // Becomes the default generator's state now. The memory is written over in
  // place when no copy of this state is held elsewhere (a step's own state,
  // taken every step, allocates nothing); otherwise the copies keep theirs.
  void take_now();

  bool known() const { return position_ != nullptr; }
  // Sets the default generator back to this state; nothing when none is known.
  void restore() const;
  // Whether the default generator stands at this state now: after restore(),
  // true when nothing has drawn from it since. False when none is known.
  bool is_current() const;
  // get_state()'s bytes (undefined when none is known): what a snapshot keeps.
  at::Tensor bytes() const;
  // The memory a kept state holds, for budgets.
  int64_t size_bytes() const;

 private:
  struct Position;  // the engine and its cached normal samples (cpu_rng_state.cpp)
  explicit CpuRngState(std::shared_ptr<Position> position) : position_(std::move(position)) {}
  // Shared by copies, which never see it change: take_now() writes in place only when it is unique.
  std::shared_ptr<Position> position_;
};

}  // namespace nanscope
