#pragma once
// What replaying a snapshot would run and load, read without running or
// loading any of it: where its model comes from (a built-in by name, the
// program's own code, or a TorchScript program stored in the file), the
// weights' and the batch's names, types and shapes, and any pickled Python
// objects in the batch. nanscope-replay --inspect prints it; the viewer's
// snapshot tab says the one-line version (replay_runs_text).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/snapshot_summary.hpp"

namespace nanscope::format {

struct StoredTensor {
  std::string name;
  DType dtype = DType::float32;
  std::vector<int64_t> shape;
};

struct SnapshotInventory {
  SnapshotSummary summary;
  std::map<std::string, std::string> model_hparams;  // a built-in model's sizes, as text
  std::string optimizer;
  std::vector<StoredTensor> parameters, buffers, optimizer_state, batch;
  // How a batch of any structure nests (the Python side's JSON), "" for
  // inputs and targets; its tensors are named "leaf N" in `batch`.
  std::string batch_structure;
};

// Throws FormatError naming the file for a missing, foreign or malformed
// snapshot; reads no tensor's bytes and no program.
SnapshotInventory read_snapshot_inventory(const std::string& path);

// True when replaying runs code stored in the snapshot: a TorchScript
// program, or a batch's pickled Python objects (loading either runs code the
// file chose).
bool carries_code(const SnapshotSummary& snapshot);

// Where replaying this snapshot gets the code it runs, in one sentence, with
// the warning to replay only a trusted file when any of it comes from the file.
std::string replay_runs_text(const SnapshotSummary& snapshot);

}  // namespace nanscope::format
