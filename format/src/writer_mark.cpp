#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"

namespace nanscope::format {

namespace {

// HDF5's file format specification, "Superblock": the signature, then for
// versions 2 and 3 the version, the sizes of offsets and lengths, and the
// file consistency flags. Version 3 (what SWMR writers use) keeps the flags
// set while a writer has the file: bit 0 write access, bit 2 SWMR write.
constexpr unsigned char kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr size_t kVersionOffset = 8, kFlagsOffset = 11;
constexpr unsigned char kWriteAccess = 0x01, kSwmrWriteAccess = 0x04;

}  // namespace

bool has_writer_mark(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw FormatError(path, "cannot open the file to read its writer's mark");
  // The superblock sits at 0 or, after a user block, at 512, 1024, 2048, ...
  for (uint64_t base = 0;; base = base == 0 ? 512 : base * 2) {
    unsigned char head[kFlagsOffset + 1] = {};
    file.clear();
    file.seekg(std::streamoff(base));
    if (!file.read(reinterpret_cast<char*>(head), sizeof head))
      throw FormatError(path, "not an HDF5 file (no HDF5 signature)");
    if (!std::equal(std::begin(kSignature), std::end(kSignature), head)) continue;
    // HDF5 keeps the mark in version 3 superblocks only.
    if (head[kVersionOffset] < 3) return false;
    return (head[kFlagsOffset] & (kWriteAccess | kSwmrWriteAccess)) != 0;
  }
}

}  // namespace nanscope::format
