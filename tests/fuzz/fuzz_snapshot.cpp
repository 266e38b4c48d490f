// A snapshot from outside: the summary every program reads first (viewer,
// nanscope-replay's report), the inventory --inspect reads (every tensor's
// shape, none of its bytes), then every group, attribute and tensor in it.
#include "archive_walk.hpp"
#include "fuzz_input.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/snapshot_inventory.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = nanscope::fuzz::input_file(data, size, ".h5");
  try {
    nanscope::format::read_snapshot_summary(path);
  } catch (const nanscope::format::FormatError&) {}
  try {
    nanscope::format::read_snapshot_inventory(path);
  } catch (const nanscope::format::FormatError&) {}
  nanscope::fuzz::walk_archive(path, nanscope::format::kSnapshotFileKind);
  return 0;
}
