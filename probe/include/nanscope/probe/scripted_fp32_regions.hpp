#pragma once
// fp32 regions for TorchScript models, as replay's precision bisection needs.
//
// A native model opens a scope at each module's entry, where Fp32Regions
// switches autocast off. A TorchScript model's modules are frames of the
// interpreter: run unoptimised (as nanscope runs them), each module's forward
// is a frame of its own, and the interpreter announces each frame it enters
// to RecordFunction callbacks (scope TORCHSCRIPT_FUNCTION) with the frame's
// arguments, the first of which is the module itself (its path comes from the
// model's registration, torchscript_modules.hpp). While a ScriptedFp32Regions is alive, entering the forward of a
// listed module (or of anything inside one) switches autocast off until the
// frame is left, and hands the frame its floating arguments in fp32: what
// `with autocast(enabled=False): module(x.float())` does in Python. Without
// the cast a region would receive the bf16 activations of the modules before
// it, and its first matmul would reject them beside its fp32 weights.
//
// The arguments are swapped in the interpreter's own stack, which the callback
// reads in place (LibTorch 1.13 to 2.x); the cast is an ordinary
// differentiable op, so the backward sees it too.
#include <string>
#include <vector>

namespace nanscope::probe {

class ScriptedFp32Regions {
 public:
  explicit ScriptedFp32Regions(std::vector<std::string> modules);
  ~ScriptedFp32Regions();
  ScriptedFp32Regions(const ScriptedFp32Regions&) = delete;
  ScriptedFp32Regions& operator=(const ScriptedFp32Regions&) = delete;

  // Whether the step entered a listed module's frame at all: false means the
  // interpreter announced no such frame (an optimised, inlined graph), and the
  // re-run said nothing about these modules.
  bool entered() const;
  // The listed modules whose frames the step did not enter.
  std::vector<std::string> not_entered() const;
};

}  // namespace nanscope::probe
