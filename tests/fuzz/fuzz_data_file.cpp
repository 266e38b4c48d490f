// A training data file from outside (--data): /inputs and /targets.
#include "fuzz_input.hpp"
#include "nanscope/format/data_file.hpp"
#include "nanscope/format/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    nanscope::format::read_data_file(nanscope::fuzz::input_file(data, size, ".h5"));
  } catch (const nanscope::format::FormatError&) {}
  return 0;
}
