#pragma once
// What every fuzz target does first: the input bytes become a file (the
// readers take paths), one per process, rewritten for each input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "nanscope/format/rehearsal.hpp"

// The readers' rehearsal in a forked child (format/rehearsal.hpp) is off while
// fuzzing, so the fuzzer runs at full speed and sees HDF5's own crashes
// (tests/fuzz/run.sh tells them from ours); NANSCOPE_FUZZ_REHEARSAL=1 keeps it
// on, as the programs run, for replaying kept crashers.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  nanscope::format::set_rehearsal(std::getenv("NANSCOPE_FUZZ_REHEARSAL") != nullptr);
  return 0;
}

namespace nanscope::fuzz {

inline std::string input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = "/tmp/nanscope-fuzz-" + std::to_string(getpid()) + suffix;
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  return path;
}

}  // namespace nanscope::fuzz
