#include "rehearsal.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <thread>
#include <vector>

#include "h5.hpp"
#include "nanscope/format/rehearsal.hpp"

namespace nanscope::format::h5 {

namespace {

// The bound's terms. The walk and the readers hold what they read (a run's
// rows, a data file's arrays, small datasets of an archive) plus HDF5's
// metadata cache and our tables: a few times the file's size at most. The
// allowance covers a small file's fixed costs many times over (nanscope-report
// reads a 110 KB run file in 34 MB of resident memory all told); a compressed
// data file that expands past 16x would be refused, and real data compresses
// a few times at most.
constexpr uint64_t kMemoryAllowance = uint64_t(256) << 20;
constexpr uint64_t kMemoryPerFileByte = 16;
constexpr double kCpuAllowanceSeconds = 20;
constexpr double kCpuSecondsPerMiB = 0.1;  // a 1.1 GB snapshot's walk takes 0.2 s; a 1 GB run file reads in ~5 s
constexpr double kWallPerCpu = 4;          // two other CPU-bound jobs on two cores leave the child a third of one
constexpr double kWallAllowanceSeconds = 60;
// The child's exit status when an allocation failed (std::bad_alloc): the
// read needs more memory than the machine has.
constexpr int kOutOfMemoryStatus = 86;
// The child's exit status when the read threw (an error the caller's own
// read reports in words).
constexpr int kThrewStatus = 87;

constexpr hsize_t kLargestAttributeRead = hsize_t(64) << 20;  // larger ones: type and shape only

herr_t read_attribute(hid_t object, const char* name, const H5A_info_t*, void*) {
  hid_t attr = H5Aopen(object, name, H5P_DEFAULT);
  if (attr < 0) return 0;
  hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
  if (type >= 0 && space >= 0) {
    const hssize_t points = H5Sget_simple_extent_npoints(space);
    const size_t size = H5Tget_size(type);
    if (points >= 0 && size > 0 && hsize_t(points) * size <= kLargestAttributeRead) {
      std::vector<char> buffer(size_t(points) * size + 1);
      if (H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0) {
        std::vector<char*> strings(size_t(points), nullptr);
#if H5_VERSION_GE(1, 12, 0)
        if (H5Aread(attr, type, strings.data()) >= 0) H5Treclaim(type, space, H5P_DEFAULT, strings.data());
#else
        if (H5Aread(attr, type, strings.data()) >= 0) H5Dvlen_reclaim(type, space, H5P_DEFAULT, strings.data());
#endif
      } else {
        H5Aread(attr, type, buffer.data());
      }
    }
  }
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  H5Aclose(attr);
  return 0;
}

constexpr hsize_t kLargestDatasetRead = hsize_t(1) << 20;  // larger ones: type, shape and layout only
constexpr int kDeepest = 32;

void walk(hid_t location, int depth);

// Every link of a group in the order the readers list them (by name,
// increasing: HDF5 builds the same sorted tables the readers make it build).
herr_t visit_link(hid_t group, const char* name, const H5L_info_t*, void* depth) {
  hid_t object = H5Oopen(group, name, H5P_DEFAULT);
  if (object < 0) return 0;
  if (H5Iget_type(object) == H5I_GROUP) {
    walk(object, *static_cast<int*>(depth) + 1);
  } else if (H5Iget_type(object) == H5I_DATASET) {
    hsize_t index = 0;
    H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, read_attribute, nullptr);
    hid_t type = H5Dget_type(object), space = H5Dget_space(object), layout = H5Dget_create_plist(object);
    if (type >= 0 && space >= 0) {
      const hssize_t points = H5Sget_simple_extent_npoints(space);
      const size_t size = H5Tget_size(type);
      const bool variable = H5Tis_variable_str(type) > 0 || H5Tget_class(type) == H5T_VLEN;
      if (!variable && points > 0 && size > 0 && hsize_t(points) * size <= kLargestDatasetRead) {
        std::vector<char> buffer(size_t(points) * size);
        H5Dread(object, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data());
      }
    }
    for (hid_t id : {type, space, layout})
      if (id >= 0) H5Idec_ref(id);
  }
  H5Oclose(object);
  return 0;
}

void walk(hid_t location, int depth) {
  hsize_t index = 0;
  H5Aiterate2(location, H5_INDEX_NAME, H5_ITER_INC, &index, read_attribute, nullptr);
  if (depth > kDeepest) return;
  index = 0;
  H5Literate(location, H5_INDEX_NAME, H5_ITER_INC, &index, visit_link, &depth);
}

bool in_rehearsal = false;  // set in the child: a read inside a rehearsal is not rehearsed again
bool rehearsal_enabled = true;

// In the child, a crash must end it by its signal: no handler of the
// parent's (a sanitizer's, a fuzzer's) gets to report or save anything, and
// no core file is written for it.
void default_crash_handlers() {
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGXCPU}) std::signal(signal, SIG_DFL);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
}

// The child's own words (an assertion inside HDF5, a sanitizer's report) are
// not the reader's: the parent says in one line what the rehearsal met.
void quiet_stderr() {
  const int null = ::open("/dev/null", O_WRONLY);
  if (null >= 0) ::dup2(null, STDERR_FILENO);
}

// A field of /proc/PID/status in bytes ("VmHWM:  1234 kB"); 0 when unreadable.
// Read without touching the heap: the parent polls this while the child
// reads, and must come to its own read with the heap the child had, or a
// file whose HDF5 crash depends on what the heap holds (a read of memory
// HDF5 never wrote) crashes the parent where it spared the child.
uint64_t status_bytes(const char* status_file, const char* field) {
  char text[4096];
  const int fd = ::open(status_file, O_RDONLY);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  const size_t length = std::strlen(field);
  for (const char* line = text;;) {
    if (std::strncmp(line, field, length) == 0 && line[length] == ':')
      return uint64_t(std::strtoull(line + length + 1, nullptr, 10)) << 10;
    const char* end = std::strchr(line, '\n');
    if (!end) return 0;
    line = end + 1;
  }
}

// The child's limits. CPU time is a hard limit (load does not change it).
// Memory is watched from the parent, not limited here: a child whose
// allocations fail takes other paths than the parent's read would (HDF5
// reports some failed allocations, and swallows others), so it must meet
// exactly what the parent would, and be stopped when that is too much.
void limit_child(const ReadBound& bound) {
  // A new process has used no CPU time: the limit is the read's own.
  const rlim_t seconds = rlim_t(std::ceil(bound.cpu_seconds));
  const rlimit cpu{seconds, seconds + 2};  // SIGXCPU at the first, SIGKILL at the second
  setrlimit(RLIMIT_CPU, &cpu);
}

std::string mebibytes(uint64_t bytes) { return std::to_string((bytes + (uint64_t(1) << 20) - 1) >> 20) + " MiB"; }

std::string seconds_text(double seconds) { return std::to_string(int64_t(std::ceil(seconds))) + " s"; }

std::string out_of_memory(const ReadBound& bound, uint64_t file_bytes) {
  return "is corrupt: reading it needed more than " + mebibytes(bound.memory_bytes) +
         " of memory, more than a file of " + std::to_string(file_bytes) +
         " bytes can justify (nothing was read from it)";
}

}  // namespace

ReadBound read_bound(uint64_t file_bytes) {
  ReadBound bound;
  bound.memory_bytes = kMemoryAllowance + kMemoryPerFileByte * file_bytes;
  bound.cpu_seconds = kCpuAllowanceSeconds + kCpuSecondsPerMiB * double(file_bytes) / double(1 << 20);
  bound.wall_seconds = kWallAllowanceSeconds + kWallPerCpu * bound.cpu_seconds;
  return bound;
}

void walk_metadata(const std::string& path) {
  // Opened exactly as the readers open it: a corrupt superblock costs what
  // it costs them (each SWMR read attempt re-reads the metadata).
  Handle file = open_file_readonly(path);
  walk(file.get(), 0);
}

namespace {

// Children that said they were done and are still tearing down: reaped
// later, without waiting (a child's exit frees what it read, which takes
// as long as a fair part of the read on a big file). A fixed table, not the
// heap: a caller reading behind its child must keep the heap the child had.
struct ExitingChildren {
  std::array<pid_t, 32> pids{};
  size_t count = 0;
};
ExitingChildren& exiting_children() {
  static ExitingChildren children;
  return children;
}

void reap_exited_children() {
  ExitingChildren& children = exiting_children();
  size_t kept = 0;
  for (size_t i = 0; i < children.count; ++i)
    if (waitpid(children.pids[i], nullptr, WNOHANG) == 0) children.pids[kept++] = children.pids[i];
  children.count = kept;
}

void leave_to_exit(pid_t child) {
  if (waitpid(child, nullptr, WNOHANG) != 0) return;
  ExitingChildren& children = exiting_children();
  if (children.count == children.pids.size()) reap_exited_children();
  if (children.count == children.pids.size()) {
    waitpid(children.pids[0], nullptr, 0);  // 32 still exiting: wait for the oldest
    children.pids[0] = children.pids[--children.count];
  }
  children.pids[children.count++] = child;
}

// The child's end of its pipe, where it says each checkpoint it passes (-1
// outside a child), and the child a caller reads behind, with the
// checkpoints this process passed (read_under_one_rehearsal).
int progress_fd = -1;
ChildRead* leading_child = nullptr;
size_t checkpoints_here = 0;

constexpr auto kWatchPeriod = std::chrono::milliseconds(1);

}  // namespace

ChildRead::ChildRead(const std::string& path, const std::function<void()>& read, Watched watched) : path_(path) {
  silence_errors();
  reap_exited_children();
  if (pipe2(done_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) done_pipe_[0] = done_pipe_[1] = -1;
  struct stat st {};
  file_bytes_ = ::stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
  bound_ = read_bound(file_bytes_);
  // The child's resident memory starts as ours (fork resets its peak to it).
  resident_at_fork_ = status_bytes("/proc/self/status", "VmRSS");
  child_ = fork();
  if (child_ < 0) return;  // no process to spare: the reader goes on without the defence
  if (child_ == 0) {
    in_rehearsal = true;
    progress_fd = done_pipe_[1];
    default_crash_handlers();
    quiet_stderr();
    limit_child(bound_);
    int status = 0;
    try {
      read();
    } catch (const std::bad_alloc&) {
      _exit(kOutOfMemoryStatus);  // more than the machine has: the parent would meet it too
    } catch (...) {
      status = kThrewStatus;
    }
    // The read ended without a crash: said at once, before the exit's teardown.
    if (done_pipe_[1] >= 0) (void)!::write(done_pipe_[1], "d", 1);
    _exit(status);  // no exit handlers, no destructors of the parent's objects
  }
  if (done_pipe_[1] >= 0) ::close(done_pipe_[1]);
  done_pipe_[1] = -1;
  started_ = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(watch_mutex_);
    watched_ = child_;
  }
  // The watch starts after the fork, here only: a thread alive at the fork
  // may hold a lock of the C library's (the loader's, a sanitizer's) that
  // the child would then wait on for ever. pthread_create takes nothing from
  // the heap, which stays the child's.
  if (watched == Watched::in_background) watching_ = pthread_create(&watcher_, nullptr, &ChildRead::watch, this) == 0;
}

void* ChildRead::watch(void* self) {
  auto& child = *static_cast<ChildRead*>(self);
  std::unique_lock<std::mutex> lock(child.stop_mutex_);
  while (!child.stop_cv_.wait_for(lock, kWatchPeriod, [&child] { return child.stop_watch_; })) child.stop_if_overrun();
  return nullptr;
}

ChildRead::~ChildRead() {
  stop_watching();
  for (int fd : done_pipe_)
    if (fd >= 0) ::close(fd);
  if (child_ <= 0) return;
  kill(child_, SIGKILL);
  int status = 0;
  waitpid(child_, &status, 0);
}

void ChildRead::stop_watching() {
  if (!watching_) return;
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_watch_ = true;
  }
  stop_cv_.notify_one();
  pthread_join(watcher_, nullptr);
  watching_ = false;
}

bool ChildRead::take_progress() {
  if (done_pipe_[0] < 0) return false;
  char said[64];
  for (;;) {
    const ssize_t n = ::read(done_pipe_[0], said, sizeof said);
    if (n <= 0) return false;
    for (ssize_t i = 0; i < n; ++i) {
      if (said[i] == 'd') return true;
      ++passed_;
    }
  }
}

void ChildRead::stop_if_overrun() {
  std::lock_guard<std::mutex> lock(watch_mutex_);
  if (watched_ <= 0 || overrun_.load() != Overrun::none) return;
  // Its resident peak since the fork, less what it shared with us then:
  // checked every 1 ms at most, which a read that touches gigabytes
  // passes by a few megabytes before it is stopped.
  char child_status[64];
  std::snprintf(child_status, sizeof child_status, "/proc/%d/status", int(watched_));
  const uint64_t peak = status_bytes(child_status, "VmHWM");
  if (peak > resident_at_fork_ && peak - resident_at_fork_ > bound_.memory_bytes)
    overrun_ = Overrun::memory;
  else if (std::chrono::steady_clock::now() > started_ + std::chrono::duration<double>(bound_.wall_seconds))
    overrun_ = Overrun::wall;
  else
    return;
  kill(watched_, SIGKILL);
}

std::string ChildRead::failure_words(int status, const rusage& usage) const {
  const Overrun overrun = overrun_.load();
  if (overrun == Overrun::memory) return out_of_memory(bound_, file_bytes_);
  if (overrun == Overrun::wall)
    return "is corrupt: reading it did not finish in " + seconds_text(bound_.wall_seconds) +
           " (nothing was read from it)";
  // The child leaves with 0 or kThrewStatus whatever the read did; anything
  // else is a crash (a signal, or a sanitizer's report of one: it exits
  // with 1) or a bound it met.
  const double cpu_used = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                          1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  if (WIFSIGNALED(status) && (WTERMSIG(status) == SIGXCPU || cpu_used >= std::floor(bound_.cpu_seconds)))
    return "is corrupt: reading it took more than " + seconds_text(bound_.cpu_seconds) +
           " of CPU time, more than a file of " + std::to_string(file_bytes_) +
           " bytes can justify (nothing was read from it)";
  if (WIFSIGNALED(status))
    return std::string("is corrupt: reading it crashed the HDF5 library (") + strsignal(WTERMSIG(status)) +
           ", in a child process; nothing was read from it)";
  if (WIFEXITED(status) && WEXITSTATUS(status) == kOutOfMemoryStatus) return out_of_memory(bound_, file_bytes_);
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != kThrewStatus)
    return "is corrupt: reading it crashed the HDF5 library (exit status " + std::to_string(WEXITSTATUS(status)) +
           ", in a child process; nothing was read from it)";
  return "";
}

void ChildRead::update() {
  if (child_ <= 0) return;
  std::unique_lock<std::mutex> lock(watch_mutex_);
  int status = 0;
  rusage usage{};
  const pid_t ended = wait4(child_, &status, WNOHANG, &usage);
  const bool said_done = take_progress();  // after wait4: all an ended child said is read
  if (ended == 0 && said_done && overrun_.load() == Overrun::none) {
    // Done reading, within its bounds: its exit is left to finish on its own.
    watched_ = -1;
    leave_to_exit(child_);
    child_ = -1;
    return;
  }
  if (ended == 0) {
    lock.unlock();
    stop_if_overrun();
    if (overrun_.load() == Overrun::none) return;  // still reading
    waitpid(child_, &status, 0);                   // stopped, here or by the watch
    lock.lock();
  }
  watched_ = -1;
  child_ = -1;
  if (ended >= 0) failure_ = failure_words(status, usage);
}

bool ChildRead::poll() {
  update();
  if (!failure_.empty()) throw FormatError(path_, failure_);
  return child_ <= 0;
}

void ChildRead::wait_past(size_t checkpoints) {
  for (;;) {
    update();
    if (passed_ >= checkpoints) return;  // a failure after that part is met at a later one
    if (child_ <= 0) break;
    // Woken by the child's next word, or after a period to keep its bounds.
    pollfd said{done_pipe_[0], POLLIN, 0};
    ::poll(&said, 1, int(kWatchPeriod.count()));
  }
  if (!failure_.empty()) throw FormatError(path_, failure_);
}

void rehearse_in_child(const std::string& path, const std::function<void()>& read) {
  if (in_rehearsal || !rehearsal_enabled) return;
  ChildRead child(path, read);
  child.wait_past(std::numeric_limits<size_t>::max());
}

bool rehearsal_needed() { return rehearsal_enabled && !in_rehearsal; }

}  // namespace nanscope::format::h5

namespace nanscope::format {

void set_rehearsal(bool on) { h5::rehearsal_enabled = on; }

void read_under_one_rehearsal(const std::string& path, const std::function<void()>& reads) {
  if (!h5::rehearsal_needed()) {
    reads();
    return;
  }
  // The child reads first; this process reads behind it, each part once the
  // child has read it without harm: the rehearsal costs about the first
  // part's read, not a whole read, where two cores are free.
  h5::ChildRead child(path, reads, h5::ChildRead::Watched::in_background);
  struct Behind {
    explicit Behind(h5::ChildRead& child) {
      h5::in_rehearsal = true;  // the reads here are not rehearsed again
      h5::leading_child = &child;
      h5::checkpoints_here = 0;
    }
    ~Behind() {
      h5::leading_child = nullptr;
      h5::in_rehearsal = false;
    }
  } behind(child);
  child.wait_past(1);
  reads();
  child.wait_past(std::numeric_limits<size_t>::max());  // its read is over (at the last part, already)
}
bool rehearsal_on() { return h5::rehearsal_enabled; }

void rehearsal_checkpoint() {
  if (h5::progress_fd >= 0) {
    // A full pipe loses the word: the caller then waits for the read's end.
    (void)!::write(h5::progress_fd, "c", 1);
  } else if (h5::leading_child) {
    h5::leading_child->wait_past(++h5::checkpoints_here + 1);
  }
}

}  // namespace nanscope::format
