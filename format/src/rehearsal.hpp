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
#include <pthread.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "nanscope/format/rehearsal.hpp"

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
// caller goes on (the viewer's rows fetched behind its frames, or the
// caller's own read following the child's, read_under_one_rehearsal). The
// child runs `read` under read_bound(the file's size) and ends; what it
// read must reach the caller through memory shared before the fork, or the
// caller reads it again.
class ChildRead {
 public:
  // Watched::in_background: a thread of the caller's keeps the child's
  // memory and wall-time bounds while the caller is busy (its own read
  // behind the child's), not only when it polls.
  enum class Watched : uint8_t { when_polled, in_background };
  ChildRead(const std::string& path, const std::function<void()>& read, Watched watched = Watched::when_polled);
  ~ChildRead();  // stops a child still running
  ChildRead(const ChildRead&) = delete;
  ChildRead& operator=(const ChildRead&) = delete;
  // Never blocks: false while the child runs, true once it has ended (its
  // read done, or thrown: the caller's own read reports that). Throws FormatError like
  // rehearse_in_child for a crash or a bound met. With no process to spare,
  // nothing ran: true at once, and started() is false.
  bool poll();
  // Blocks until the child's read has passed `checkpoints` calls of
  // rehearsal_checkpoint() or ended; throws as poll() does.
  void wait_past(size_t checkpoints);
  bool started() const { return started_ != std::chrono::steady_clock::time_point{}; }

 private:
  enum class Overrun : uint8_t { none, memory, wall };
  // Whether the child ended, and what it said: an end by a crash or a
  // bound is kept in failure_, thrown once the caller needs a part the
  // child did not read.
  void update();
  bool take_progress();    // reads what the child said: true once it said its read is over
  void stop_if_overrun();  // kills a child past its memory or wall-time bound (either thread)
  void stop_watching();    // ends the background thread
  std::string failure_words(int status, const rusage& usage) const;  // "" for an end that is no failure

  std::string path_;
  uint64_t file_bytes_ = 0, resident_at_fork_ = 0;
  ReadBound bound_;
  pid_t child_ = -1;
  int done_pipe_[2] = {-1, -1};  // the child writes 'c' at each checkpoint, 'd' once its read is over
  size_t passed_ = 0;            // checkpoints the child said it passed
  std::string failure_;          // why the child failed, in words for a FormatError
  std::chrono::steady_clock::time_point started_{};
  // Shared with the background thread: the child it may stop (-1 once
  // reaped or let go, so a reused pid is never signalled), and why it did.
  std::mutex watch_mutex_;
  pid_t watched_ = -1;
  std::atomic<Overrun> overrun_{Overrun::none};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stop_watch_ = false;  // under stop_mutex_
  pthread_t watcher_{};
  bool watching_ = false;
  static void* watch(void* self);  // the background watch's loop
};

// A read here is to be rehearsed first: rehearsal on, and not in a child.
bool rehearsal_needed();

// An archive's reads come later, one call at a time; its rehearsal is a walk
// of everything the readers touch: every group and attribute listed by name
// (the readers' order, which makes HDF5 build the same tables), every
// attribute read, every dataset's type, shape and layout, small datasets read.
void walk_metadata(const std::string& path);

}  // namespace nanscope::format::h5
