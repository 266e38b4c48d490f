#include "checkpoint.hpp"

#include <c10/core/GradMode.h>
#include <torch/utils.h>

#include <cstdio>
#include <map>
#include <stdexcept>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope {

using probe::get_tensor;
using probe::put_tensor;

void save_checkpoint(const std::string& path, const TrainableModel& model, int64_t step) {
  const std::string tmp = path + ".tmp";
  {
    format::Archive archive = format::Archive::create(tmp, format::kCheckpointFileKind);
    format::Group root = archive.root();
    ModelSpec spec = model.spec();
    root.set_attr("model", spec.name);
    root.set_attr("step", step);
    format::Group hparams = root.group("hparams");
    for (const auto& [key, value] : spec.hparams) hparams.set_attr(key, value);
    format::Group params = root.group("parameters");
    for (const auto& [name, tensor] : model.named_parameters()) put_tensor(params, name, tensor);
    format::Group buffers = root.group("buffers");
    for (const auto& [name, tensor] : model.named_buffers()) put_tensor(buffers, name, tensor);
    archive.close();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw format::WriteError(path, "cannot move the new checkpoint into place");
}

namespace {

void copy_into(const format::Group& group, const NamedTensors& targets, const std::string& path, const char* what) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    if (!group.has(name)) throw format::FormatError(path, std::string(what) + " '" + name + "' missing");
    at::Tensor value = get_tensor(group, name);
    if (value.sizes() != target.sizes())
      throw format::FormatError(path, std::string(what) + " '" + name + "' has shape " + c10::str(value.sizes()) +
                                          ", the model expects " + c10::str(target.sizes()));
    at::Tensor t = target;
    t.copy_(value);
  }
}

}  // namespace

int64_t load_checkpoint(const std::string& path, TrainableModel& model) {
  format::Archive archive = format::Archive::open(path, format::kCheckpointFileKind);
  format::Group root = archive.root();
  const std::string saved = root.attr_string("model");
  const ModelSpec spec = model.spec();
  if (saved != spec.name) throw format::FormatError(path, "holds a '" + saved + "' model, not '" + spec.name + "'");
  format::Group hparams = root.group("hparams");
  for (const auto& [key, value] : spec.hparams)
    if (hparams.has_attr(key) && hparams.attr_int(key) != value)
      throw format::FormatError(path, "was saved with " + key + "=" + std::to_string(hparams.attr_int(key)) +
                                          ", the model has " + std::to_string(value));
  copy_into(root.group("parameters"), model.named_parameters(), path, "parameter");
  copy_into(root.group("buffers"), model.named_buffers(), path, "buffer");
  return root.attr_int("step");
}

}  // namespace nanscope
