#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "h5.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "rehearsal.hpp"

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

bool clear_mark_if_writer_gone(const std::string& path) {
  if (!has_writer_mark(path)) return false;
  h5::rehearse_in_child(path, [&] { h5::walk_metadata(path); });
  int64_t pid = -1;
  std::string host;
  {
    const h5::Handle file = h5::open_file_readonly(path);
    if (!h5::attr_exists(file.get(), "writer_pid") || !h5::attr_exists(file.get(), "writer_host")) return false;
    pid = h5::read_int_attr(file.get(), "writer_pid", path);
    host = h5::read_string_attr(file.get(), "writer_host", path);
  }
  char here[256] = {};
  gethostname(here, sizeof here - 1);
  if (pid <= 0 || host != here) return false;
  // Alive, or a process this one may not signal (it exists): left alone.
  if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) return false;
  return clear_writer_mark(path);
}

}  // namespace nanscope::format
