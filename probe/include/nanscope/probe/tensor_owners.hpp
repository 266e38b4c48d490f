#pragma once
// Module attribution for native models without module scopes: the module an
// op belongs to follows from the tensors it reads. An op that reads a
// module's own parameter or buffer belongs to that module; an op between two
// such ops (a functional call, an activation, a residual add) belongs to the
// innermost module both belong to; ops before the first or after the last
// belong to the root (""). No change to the model's forward, and nothing on a
// clean step: the lookup runs inside op-level capture only.
//
// Parameter-free submodules (a Dropout, a ReLU module) are not named; their
// ops go to the module around them. NANSCOPE_MODULE_SCOPE names them exactly
// and wins where it is open.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nanscope::probe {

// Registers every (dotted name, tensor) pair, "fc1.weight", "bn.running_mean":
// the tensor's owner is the name without its last part. Tensors that are gone
// are forgotten; registering a model again replaces its entries.
void register_tensor_owners(const std::vector<std::pair<std::string, at::Tensor>>& named_tensors);

// The module whose parameter or buffer `t` is; nullopt for any other tensor.
std::optional<std::string> tensor_owner(const at::Tensor& t);
// Any tensors registered at all (so capture can skip the lookups otherwise).
bool any_tensor_owners();

// The innermost module containing both: "blocks.0.attn.proj" and
// "blocks.0.ln2" -> "blocks.0"; "conv1" and "conv2" -> "".
std::string common_module(const std::string& a, const std::string& b);

}  // namespace nanscope::probe
