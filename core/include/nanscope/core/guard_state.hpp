#pragma once
// What the guard has learnt that a resumed run needs back besides the
// weights and the optimizer: precision and fallback, scaler, backoffs. Its
// fields are declared once, in NANSCOPE_GUARD_STATE_FIELDS; the struct, a
// checkpoint's /training attributes (core/checkpoint.cpp) and Python's
// state_dict() (python/src/module.cpp) are all made from that list, so a
// field added there reaches all three.
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/core/precision.hpp"
#include "nanscope/core/sentinel.hpp"

namespace nanscope {

// X(type, name, initial value), in the order checkpoints and state_dict list them.
#define NANSCOPE_GUARD_STATE_FIELDS(X)                                                                 \
  X(Amp, amp, Amp::fp32)                                                                               \
  X(int64_t, fallback_step, -1)                                                                        \
  X(double, lr_multiplier, 1) /* the LR cut: lr_backoff per fallback and rollback */                   \
  X(int64_t, rollbacks, 0)                                                                             \
  X(bool, scaling, false)                                                                              \
  X(double, loss_scale, 1)                                                                             \
  X(int64_t, growth_tracker, 0)                                                                        \
  X(int64_t, last_applied_step, -1)               /* the last step whose update reached the weights */ \
  X(int64_t, applied_steps, 0)                    /* updates that reached the weights */               \
  X(std::vector<std::string>, fp32_modules, {})   /* in fp32 (planned, or --fallback auto's remedy) */ \
  X(std::vector<std::string>, pinned_kernels, {}) /* --fallback auto's kernel remedies ("attn=math") */

struct GuardState {
#define NANSCOPE_GUARD_STATE_MEMBER(type, name, initial) type name = initial;
  NANSCOPE_GUARD_STATE_FIELDS(NANSCOPE_GUARD_STATE_MEMBER)
#undef NANSCOPE_GUARD_STATE_MEMBER
  // The early warnings' baselines: not in checkpoints (a resumed run learns
  // them afresh), in state_dict; empty: start afresh.
  Sentinel::State sentinel;
  // A state from before format 1.7 (a checkpoint, or a state_dict with the
  // key rollback_lr_multiplier) kept the rollbacks' LR cut alone: the guard
  // that restores it adds its fallback's (StepGuard's restore).
  bool lr_multiplier_lacks_fallback = false;
};

// What a state from before format 1.7 called field `name` (lr_multiplier was
// rollback_lr_multiplier, the rollbacks' cut alone); the name otherwise.
inline const char* name_before_1_7(const char* name) {
  return std::string(name) == "lr_multiplier" ? "rollback_lr_multiplier" : name;
}

// Calls visit(name, field) for each listed field of `state` (const or not), in order.
template <typename State, typename Visit>
void for_each_guard_state_field(State& state, Visit&& visit) {
#define NANSCOPE_GUARD_STATE_VISIT(type, name, initial) visit(#name, state.name);
  NANSCOPE_GUARD_STATE_FIELDS(NANSCOPE_GUARD_STATE_VISIT)
#undef NANSCOPE_GUARD_STATE_VISIT
}

}  // namespace nanscope
