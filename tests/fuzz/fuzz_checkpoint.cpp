// A checkpoint from outside (--init, --resume): every group, attribute,
// tensor and blob, as load_checkpoint and load_resume_state read them.
#include "archive_walk.hpp"
#include "fuzz_input.hpp"
#include "nanscope/format/version.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nanscope::fuzz::walk_archive(nanscope::fuzz::input_file(data, size, ".h5"), nanscope::format::kCheckpointFileKind);
  return 0;
}
