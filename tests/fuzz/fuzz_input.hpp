#pragma once
// What every fuzz target does first: the input bytes become a file (the
// readers take paths), one per process, rewritten for each input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

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
