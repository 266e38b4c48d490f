#include "nanscope/format/snapshot_inventory.hpp"

#include <cstdio>

#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"
#include "rehearsal.hpp"

namespace nanscope::format {

namespace {

// The probe's named-tensor groups: a `count`, datasets 000000, 000001, ...
// and each one's name as the attribute name_000000 (names may hold '/').
std::vector<StoredTensor> named_shapes(const Group& group) {
  std::vector<StoredTensor> out;
  if (!group.has_attr("count")) return out;
  const int64_t count = group.attr_int("count");
  if (count < 0 || size_t(count) > group.children().size())
    throw FormatError(group.file_path(), group.name() + " claims " + std::to_string(count) + " tensors");
  for (int64_t i = 0; i < count; ++i) {
    char key[24];
    std::snprintf(key, sizeof key, "%06lld", static_cast<long long>(i));
    const TensorData t = group.tensor_shape(key);
    out.push_back({group.attr_string(std::string("name_") + key), t.dtype, t.shape});
  }
  return out;
}

// The batch as the loop gave it: inputs and targets, or a structure's leaves
// in order (named by their place), and the data set's row numbers.
std::vector<StoredTensor> batch_shapes(const Group& batch) {
  std::vector<StoredTensor> out;
  auto add = [&](const Group& g, const std::string& key, const std::string& name) {
    if (!g.has(key)) return false;
    const TensorData t = g.tensor_shape(key);
    out.push_back({name, t.dtype, t.shape});
    return true;
  };
  if (batch.has("leaves")) {
    const Group leaves = batch.group("leaves");
    for (size_t i = 0; add(leaves, std::to_string(i), "leaf " + std::to_string(i)); ++i) {}
  }
  add(batch, "inputs", "inputs");
  add(batch, "targets", "targets");
  add(batch, "rows", "(data set rows)");
  return out;
}

SnapshotInventory read_tensors(const std::string& path) {
  Archive archive = Archive::open(path, kSnapshotFileKind);
  const Group root = archive.root();
  SnapshotInventory inventory;
  if (root.has("model")) {
    const Group model = root.group("model");
    if (model.has("hparams")) {
      const Group hparams = model.group("hparams");
      for (const auto& key : hparams.attr_names()) {
        const AttrValue value = hparams.attr(key);
        inventory.model_hparams[key] = std::holds_alternative<int64_t>(value) ? std::to_string(std::get<int64_t>(value))
                                       : std::holds_alternative<double>(value) ? std::to_string(std::get<double>(value))
                                                                               : std::get<std::string>(value);
      }
    }
    if (model.has("parameters")) inventory.parameters = named_shapes(model.group("parameters"));
    if (model.has("buffers")) inventory.buffers = named_shapes(model.group("buffers"));
  }
  if (root.has("optimizer")) {
    const Group optimizer = root.group("optimizer");
    if (optimizer.has_attr("name")) inventory.optimizer = optimizer.attr_string("name");
    if (optimizer.has("state")) inventory.optimizer_state = named_shapes(optimizer.group("state"));
  }
  if (root.has("batch")) {
    const Group batch = root.group("batch");
    inventory.batch = batch_shapes(batch);
    if (batch.has_attr("structure")) inventory.batch_structure = batch.attr_string("structure");
  }
  return inventory;
}

}  // namespace

SnapshotInventory read_snapshot_inventory(const std::string& path) {
  SnapshotSummary summary = read_snapshot_summary(path);  // rehearsed in a child, as every reader
  h5::rehearse_in_child(path, [&] { read_tensors(path); });
  SnapshotInventory inventory = read_tensors(path);
  inventory.summary = std::move(summary);
  return inventory;
}

bool carries_code(const SnapshotSummary& s) { return s.program_bytes > 0 || s.pickled_batch_objects > 0; }

std::string replay_runs_text(const SnapshotSummary& s) {
  std::string model;
  if (s.program_bytes > 0)
    model = "the model is a TorchScript program of " + std::to_string(s.program_bytes) +
            " bytes stored in this snapshot, and replaying it runs that program";
  else if (s.origin == Origin::python)
    model = "the model (" + s.model_name +
            ") is rebuilt by the factory you name to the Python replay (your code); the file holds its weights";
  else if (s.origin == Origin::nanscope_train)
    model = "the model is nanscope-train's built-in '" + s.model_name + "', rebuilt from its sizes";
  else
    model = "the model is the program's own registered '" + s.model_name + "' (your code); the file holds its weights";
  std::string batch;
  if (s.pickled_batch_objects > 0)
    batch = "; the batch holds " + std::to_string(s.pickled_batch_objects) +
            " pickled Python object(s), which the Python replay unpickles (unpickling runs code)";
  const char* inspect = s.origin == Origin::python ? "python3 -m nanscope inspect" : "nanscope-replay --inspect";
  const std::string trust = carries_code(s) ? ". Replay it only if it comes from a source you trust (as PyTorch says "
                                              "of TorchScript and pickle files); " +
                                                  std::string(inspect) + " shows what it holds without running it"
                                            : ": replaying runs no code from the file";
  return "Replaying: " + model + batch + trust + ".";
}

}  // namespace nanscope::format
