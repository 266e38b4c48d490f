#include "nanscope/probe/snapshot.hpp"

#include <cstdio>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/cpu_rng_state.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope::probe {

std::string snapshot_path(const std::string& run_dir, int64_t step, int rank, int world_size) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%07lld.h5", static_cast<long long>(step));
  return format::snapshot_dir(run_dir, rank, world_size) + "/" + name;
}

void write_snapshot(const std::string& path, const SnapshotContents& s) {
  const std::string tmp = path + ".tmp";
  try {
    format::Archive archive = format::Archive::create(tmp, format::kSnapshotFileKind);
    format::Group root = archive.root();
    format::write_snapshot_header(root, s);

    format::Group model = root.group("model");
    model.set_attr("name", s.model_name);
    format::Group hparams = model.group("hparams");
    for (const auto& [k, v] : s.model_hparams) hparams.set_attr(k, v);
    if (!s.torchscript_bytes.empty())
      model.put_blob("torchscript", s.torchscript_bytes.data(), s.torchscript_bytes.size());
    put_named(model.group("parameters"), s.parameters);
    put_named(model.group("buffers"), s.buffers);

    format::Group optimizer = root.group("optimizer");
    optimizer.set_attr("name", s.optimizer);
    put_named(optimizer.group("state"), s.optimizer_state);

    format::Group batch = root.group("batch");
    if (s.batch.row_dim != 0) batch.set_attr("row_dim", s.batch.row_dim);
    if (s.batch.is_nested()) {
      // Any structure: its tensors in order, and how they nest (the loop's words).
      batch.set_attr("structure", s.batch.structure);
      if (!s.batch.leaf_row_dims.empty())  // 1.8: each tensor's row dimension, where the loop declared them
        batch.put_tensor("row_dims", format::DType::int64, {int64_t(s.batch.leaf_row_dims.size())},
                         s.batch.leaf_row_dims.data());
      format::Group leaves = batch.group("leaves");
      for (size_t i = 0; i < s.batch.leaves.size(); ++i) put_tensor(leaves, std::to_string(i), s.batch.leaves[i]);
    } else {
      put_tensor(batch, "inputs", s.batch.inputs);
      if (s.batch.targets.defined()) put_tensor(batch, "targets", s.batch.targets);  // a closure step may have none
    }
    put_tensor(batch, "rows", s.batch_rows);
    format::Group rng = root.group("rng");
    if (s.cpu_rng_state.defined()) put_tensor(rng, "cpu_state", s.cpu_rng_state);
    archive.close();
  } catch (...) {
    // Give the space back (disk full): the run file still needs it.
    std::remove(tmp.c_str());
    throw;
  }
  // Written aside and renamed: a reader never sees half a snapshot.
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw format::FormatError(path, "cannot move the snapshot into place");
  }
}

SnapshotContents read_snapshot(const std::string& path) {
  // What a person reads (how the step ran, capture, layer norms) comes through
  // the format library's one reader, the viewer's too; the tensors are read here.
  SnapshotContents s;
  static_cast<format::SnapshotHeader&>(s) = std::move(format::read_snapshot_summary(path));

  format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind);
  s.weights_checked = archive.version().at_least(1, 9);
  format::Group root = archive.root();
  format::Group model = root.group("model");
  format::Group hparams = model.group("hparams");
  for (const auto& k : hparams.attr_names()) s.model_hparams[k] = hparams.attr_int(k);
  if (model.has("torchscript")) s.torchscript_bytes = model.blob("torchscript");
  s.parameters = get_named(model.group("parameters"));
  s.buffers = get_named(model.group("buffers"));
  format::Group optimizer = root.group("optimizer");
  s.optimizer = optimizer.attr_string("name");
  s.optimizer_state = get_named(optimizer.group("state"));
  format::Group batch = root.group("batch");
  if (batch.has_attr("structure")) {
    std::vector<at::Tensor> leaves;
    format::Group group = batch.group("leaves");
    for (size_t i = 0; group.has(std::to_string(i)); ++i) leaves.push_back(get_tensor(group, std::to_string(i)));
    s.batch = Batch::nested(std::move(leaves), batch.attr_string("structure"));
    if (batch.has("row_dims")) s.batch.leaf_row_dims = long_values(get_tensor(batch, "row_dims"));
  } else {
    s.batch.inputs = get_tensor(batch, "inputs");
    if (batch.has("targets")) s.batch.targets = get_tensor(batch, "targets");
  }
  if (batch.has_attr("row_dim")) s.batch.row_dim = batch.attr_int("row_dim");
  s.batch_rows = get_tensor(batch, "rows");
  format::Group rng = root.group("rng");
  if (rng.has("cpu_state")) {
    s.cpu_rng_state = get_tensor(rng, "cpu_state");
    try {
      static_cast<void>(CpuRngState::from_bytes(s.cpu_rng_state));  // what every re-run starts from
    } catch (const c10::Error&) {
      throw format::FormatError(path, "rng/cpu_state (" + std::to_string(s.cpu_rng_state.numel()) +
                                          " bytes) is not the state of a CPU random generator");
    }
  }
  return s;
}

void append_other_modules(const std::string& path, const NamedTensorList& tensors) {
  format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind, /*writable=*/true);
  format::Group root = archive.root();
  root.remove("other_modules");
  put_named(root.group("other_modules"), tensors);
  archive.close();
}

NamedTensorList read_other_modules(const std::string& path) {
  format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind);
  format::Group root = archive.root();
  if (!archive.version().at_least(1, 5) || !root.has("other_modules")) return {};
  return get_named(root.group("other_modules"));
}

}  // namespace nanscope::probe
