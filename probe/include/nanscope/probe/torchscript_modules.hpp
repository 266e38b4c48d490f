#pragma once
// Module names for TorchScript models. Capture learns where an op runs from the
// TorchScript interpreter's call stack, whose frames name a module only by the
// last attribute it was reached through: self.transformer.h[0].attn appears as
// "0" then "attn", the ModuleDict and ModuleList that were indexed but never
// called are missing. Registering the model lets capture turn those frames
// into the model's own named_modules() paths ("transformer.h.0.attn"), the
// names the run file's layers use. Unregistered models get the frames joined
// as they are.
namespace torch::jit {
struct Module;
}

namespace nanscope::probe {

// Remembers `model`'s modules (paths and classes) under its class name; a
// later model of the same class replaces them. Cheap: call it after loading.
void register_torchscript_modules(const torch::jit::Module& model);

}  // namespace nanscope::probe
