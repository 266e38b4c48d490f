#pragma once
// Any TorchScript model saved with torch.jit.script(model).save(path) whose
// forward(inputs, targets) returns a scalar loss.
#include <memory>
#include <string>

#include "nanscope/core/model.hpp"

namespace nanscope {

// Throws std::invalid_argument naming the file when it cannot be loaded.
std::unique_ptr<TrainableModel> load_scripted_model(const std::string& path);
// Same, from the bytes of a .pt file (a snapshot carries them).
std::unique_ptr<TrainableModel> load_scripted_model_bytes(const std::string& bytes, const std::string& origin);

}  // namespace nanscope
