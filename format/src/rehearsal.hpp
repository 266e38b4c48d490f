#pragma once
// The defence for files from outside. HDF5 itself crashes on some malformed
// files (a few flipped bits in a snapshot made H5Aiterate2 fault inside the
// library; many CVEs are of this kind), and others make it allocate or loop
// without end (a 30 KB checkpoint drove its metadata cache to 3.3 GB over
// 24 s). No check in our code can catch either inside HDF5. So each reader
// first does its read in a forked child: the child has the parent's exact
// memory, so it meets the same crash, allocation or loop the parent would,
// under limits the parent never has. A child that dies by a signal, needs
// more memory than the file can justify, or runs out of CPU time turns into
// a FormatError "corrupt" for the parent, which never touched the bad bytes.
// Only format/src uses this.
#include <cstdint>
#include <functional>
#include <string>

namespace nanscope::format::h5 {

// What reading a file may cost: a fixed allowance plus a multiple of the
// file's size on disk, whatever its bytes declare (docs/format.md).
struct ReadBound {
  uint64_t memory_bytes = 0;  // resident memory the read may add
  double cpu_seconds = 0;     // CPU time of the read (load does not change it)
  double wall_seconds = 0;    // a read blocked without using CPU (a stalled disk)
};
ReadBound read_bound(uint64_t file_bytes);

// Runs `read` in a forked child under read_bound(the file's size), then
// returns (inside a child already: at once). Throws FormatError(path, ...)
// when the child was killed by a signal, went past the bound's memory or CPU
// time, or did not finish in its wall time. Anything else (success, an
// exception, HDF5 error) returns: the caller then reads for real, the same
// read the child made, and reports its own errors.
void rehearse_in_child(const std::string& path, const std::function<void()>& read);

// An archive's reads come later, one call at a time; its rehearsal is a walk
// of everything the readers touch: every group and attribute listed by name
// (the readers' order, which makes HDF5 build the same tables), every
// attribute read, every dataset's type, shape and layout, small datasets read.
void walk_metadata(const std::string& path);

}  // namespace nanscope::format::h5
