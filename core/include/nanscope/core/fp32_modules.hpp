#pragma once
// Some modules in fp32, the rest in the autocast type: the remedy when a step
// is finite with autocast off and a handful of modules are what needs the
// range (a softmax over large logits, a norm's variance). Both the step guard
// (--fp32-modules, and --fallback auto after its own search) and
// nanscope-replay's precision bisection use this.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/precision.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/scripted_fp32_regions.hpp"

namespace nanscope {

// While alive, the listed modules (dotted paths, as named_modules() names
// them) run with autocast off: a native model's module scopes switch it, a
// TorchScript model's module frames (probe/scripted_fp32_regions.hpp). One at
// a time; nothing when the list is empty.
class Fp32ModuleRegions {
 public:
  Fp32ModuleRegions(const TrainableModel& model, std::vector<std::string> modules);
  // Whether a TorchScript run entered any listed module's frame (always true for native models).
  bool switchable() const;
  // The listed modules the run did not enter: names the model does not have.
  std::vector<std::string> not_entered() const;

 private:
  std::optional<probe::Fp32Regions> native_;
  std::optional<probe::ScriptedFp32Regions> scripted_;
};

// The rule, written once: a step below fp32 runs the listed modules in fp32;
// a step at fp32 runs everything so already, and switches nothing.
inline bool fp32_regions_apply(Amp amp, const std::vector<std::string>& modules) {
  return amp != Amp::fp32 && !modules.empty();
}

// A module asked for in fp32 that holds 16-bit floating weights: autocast
// off inside it still computes in them, and the float32 inputs an fp32 module
// takes would not match them (a model loaded in bf16: widen such a module
// before asking for it in fp32).
struct Module16Bit {
  std::string module, parameter, type;  // "2", its first such parameter "2.weight", "bfloat16"
};
std::vector<Module16Bit> modules_of_16bit_weights(const TrainableModel& model, const std::vector<std::string>& modules);

// What a precision search tries: re-runs of one step with some modules in fp32.
class Fp32Trial {
 public:
  virtual ~Fp32Trial() = default;
  // The modules the forward runs ops in, first-seen order.
  virtual std::vector<std::string> modules() = 0;
  virtual bool finite_with(const std::vector<std::string>& modules) = 0;
  // A TorchScript re-run that entered none of the chosen modules' frames:
  // nothing the trial says can be trusted.
  virtual bool unswitchable() const { return false; }
};

// The smallest set (1-minimal: no member can be dropped) of modules that, in
// fp32, make the step finite: each single module first (the birth's module
// first, then innermost first), then a greedy shrink of all of them. Empty
// when none is found (or the trial is unswitchable).
std::vector<std::string> minimal_fp32_modules(Fp32Trial& trial, const std::string& birth_module);

}  // namespace nanscope
