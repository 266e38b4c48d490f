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
#include <sys/types.h>

#include <chrono>
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

// The same child, polled instead of waited for: a read that runs while the
// caller goes on (the viewer's rows fetched behind its frames). The child
// runs `read` under read_bound(the file's size) and ends; what it read must
// reach the caller through memory shared before the fork.
class ChildRead {
 public:
  ChildRead(const std::string& path, const std::function<void()>& read);
  ~ChildRead();  // stops a child still running
  ChildRead(const ChildRead&) = delete;
  ChildRead& operator=(const ChildRead&) = delete;
  // Never blocks: false while the child runs, true once it has ended (its
  // read done, or thrown: the caller's own read reports that). Throws FormatError like
  // rehearse_in_child for a crash or a bound met. With no process to spare,
  // nothing ran: true at once, and started() is false.
  bool poll();
  bool started() const { return started_ != std::chrono::steady_clock::time_point{}; }

 private:
  std::string path_;
  uint64_t file_bytes_ = 0, resident_at_fork_ = 0;
  ReadBound bound_;
  pid_t child_ = -1;
  int done_pipe_[2] = {-1, -1};  // the child writes a byte once its read is over
  std::chrono::steady_clock::time_point started_{};
};

// A read here is to be rehearsed first: rehearsal on, and not in a child.
bool rehearsal_needed();

// An archive's reads come later, one call at a time; its rehearsal is a walk
// of everything the readers touch: every group and attribute listed by name
// (the readers' order, which makes HDF5 build the same tables), every
// attribute read, every dataset's type, shape and layout, small datasets read.
void walk_metadata(const std::string& path);

}  // namespace nanscope::format::h5
