#pragma once
// Module attribution for native C++ models, in the spirit of Tracy's zones:
//
//   at::Tensor forward(at::Tensor x) {
//     NANSCOPE_MODULE_SCOPE("attn");   // "blocks.0" + "attn" -> "blocks.0.attn"
//     ...
//   }
//
// Names are relative to the enclosing scope, so a path reads as
// named_modules() names it. The macro expands to nothing when built with
// NANSCOPE_PROBE_DISABLED, and to an object whose constructor is one relaxed
// atomic load when op-level capture is not running: clean steps pay nothing.
#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/kernel_trials.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope::probe {

namespace detail {
extern std::atomic<bool> g_scopes_enabled;
void push_scope(const char* name);  // relative to the enclosing scope
// A scope by its full dotted path: module hooks that know each module's path
// (the Python module's forward hooks) push these. True when the path is a
// listed fp32 module (Fp32Regions): autocast is off from here, and the hook
// hands the module its floating inputs in fp32, as `module(x.float())` would.
bool push_scope_path(const std::string& path);
void pop_scope();
// Called before a scope opens or closes, while op-level capture runs: the
// autograd nodes made since the last op belong to the module that was running.
extern void (*g_scope_listener)();
}  // namespace detail

class ModuleScope {
 public:
  explicit ModuleScope(const char* name) : active_(detail::g_scopes_enabled.load(std::memory_order_relaxed)) {
    if (active_) detail::push_scope(name);
  }
  ~ModuleScope() {
    if (active_) detail::pop_scope();
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  bool active_;
};

// Scopes opened by hooks that know each module's full dotted path (Python's
// forward pre- and post-hooks), rather than by a ModuleScope in the forward.
// Open only while scopes are active (a capture or fp32 regions listen);
// opening returns true when the path is a listed fp32 module (see push_scope_path).
inline bool module_scopes_active() { return detail::g_scopes_enabled.load(std::memory_order_relaxed); }
inline bool open_module_scope_by_path(const std::string& path) { return detail::push_scope_path(path); }
inline void close_module_scope() { detail::pop_scope(); }

// The dotted path of the innermost open scope on this thread ("" at the root).
const std::string& current_module_scope();
// Whether any scope is open on this thread. Forward hooks that open one for
// every module, the root's included (the Python module's), leave nothing to
// infer: an op in the root's own forward is the root's.
bool inside_module_scope();
// How many scopes are open on this thread. A scope opened while the backward
// runs a node is a module's forward run again: activation checkpointing's
// recomputation (op_capture.hpp).
size_t module_scope_depth();

// Ops nanscope runs for itself while op-level capture is on (keeping a model's
// buffers before a re-run and putting them back after it): the capture does
// not see them, so they are never a birth and never name a module (an op that
// reads a module's buffer names that module; tensor_owners.hpp).
class BookkeepingOps {
 public:
  BookkeepingOps();
  ~BookkeepingOps();
  BookkeepingOps(const BookkeepingOps&) = delete;
  BookkeepingOps& operator=(const BookkeepingOps&) = delete;
};
bool inside_bookkeeping_ops();

// While alive, the listed modules (dotted paths) run with autocast off: an
// fp32 region around each, as replay's precision bisection needs. Scopes are
// active meanwhile. Not reentrant; one at a time.
class Fp32Regions {
 public:
  explicit Fp32Regions(std::vector<std::string> modules);
  ~Fp32Regions();
  Fp32Regions(const Fp32Regions&) = delete;
  Fp32Regions& operator=(const Fp32Regions&) = delete;

  // The listed modules no scope opened while the regions were alive: a name
  // the model does not have (or a module that did not run).
  std::vector<std::string> not_entered() const;

 private:
  std::vector<std::string> modules_;
  std::vector<char> entered_;  // parallel to modules_
  bool scopes_were_enabled_;
};

// While alive, each listed module runs with its kernel pinned (the `kernel`
// remedy, kernel_pin.hpp): the switches are set as its scope opens and put
// back as it closes, so other modules keep theirs. The backward of an
// attention kernel is the forward's choice, so the pin holds there too.
// Scopes are active meanwhile. Nested, the inner one holds until it ends.
struct KernelRegion {
  std::string module;  // a dotted path
  format::Kernel kernel = format::Kernel::unknown;
};
class KernelRegions {
 public:
  explicit KernelRegions(std::vector<KernelRegion> regions);
  ~KernelRegions();
  KernelRegions(const KernelRegions&) = delete;
  KernelRegions& operator=(const KernelRegions&) = delete;

 private:
  std::vector<KernelRegion> regions_;
  const std::vector<KernelRegion>* outer_;
  bool scopes_were_enabled_;
};

// While alive, scopes are active and every path a scope opens is recorded:
// what a step guard checks once against the model's named_modules(), so a
// misspelt scope name is a warning, not a silently wrong answer.
class ScopeNameRecorder {
 public:
  ScopeNameRecorder();
  ~ScopeNameRecorder();
  ScopeNameRecorder(const ScopeNameRecorder&) = delete;
  ScopeNameRecorder& operator=(const ScopeNameRecorder&) = delete;
  std::vector<std::string> names() const;  // first-opened order

 private:
  std::vector<std::string> names_;
  bool scopes_were_enabled_;
};

// Labels the ops run inside it with a phase other than forward/backward, e.g.
// "grad_norm" for the global-norm computation the re-run repeats after backward.
class PhaseScope {
 public:
  explicit PhaseScope(format::Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  std::optional<format::Phase> previous_;
};
// nullopt when no PhaseScope is open on this thread.
std::optional<format::Phase> current_phase_override();

}  // namespace nanscope::probe

#define NANSCOPE_CONCAT_INNER(a, b) a##b
#define NANSCOPE_CONCAT(a, b) NANSCOPE_CONCAT_INNER(a, b)
#ifdef NANSCOPE_PROBE_DISABLED
#define NANSCOPE_MODULE_SCOPE(name) ((void)0)
#else
#define NANSCOPE_MODULE_SCOPE(name) \
  ::nanscope::probe::ModuleScope NANSCOPE_CONCAT(nanscope_module_scope_, __LINE__)(name)
#endif
