#pragma once
// nanscope-replay --inspect: what replaying a snapshot would run and load,
// shown without running or loading any of it (a TorchScript program is code,
// and so is a pickled batch object: a user looks before trusting a file).
#include <cstdint>
#include <string>
#include <vector>

#include "nanscope/format/snapshot_inventory.hpp"

namespace nanscope::replay {

struct SnapshotInspection {
  format::SnapshotInventory inventory;
  // The TorchScript program's source files inside its archive (e.g.
  // code/__torch__/model.py), listed from the archive's directory without
  // loading or reading them; empty for a model that is not TorchScript.
  std::vector<std::string> program_files;
  std::string program_error;  // why the program's files could not be listed, "" when they could
};

// Throws format::FormatError for a missing, foreign or malformed snapshot.
SnapshotInspection inspect_snapshot(const std::string& path);

std::string to_text(const SnapshotInspection& inspection);
std::string to_json(const SnapshotInspection& inspection);

}  // namespace nanscope::replay
