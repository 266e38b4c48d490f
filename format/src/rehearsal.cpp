#include "rehearsal.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

#include "h5.hpp"
#include "nanscope/format/rehearsal.hpp"

namespace nanscope::format::h5 {

namespace {

constexpr auto kRehearsalLimit = std::chrono::seconds(30);
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
// parent's (a sanitizer's, a fuzzer's) gets to report or save anything.
void default_crash_handlers() {
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(signal, SIG_DFL);
}

}  // namespace

void walk_metadata(const std::string& path) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_metadata_read_attempts(fapl, 2);
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
  if (file < 0) file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  H5Pclose(fapl);
  if (file < 0) return;
  walk(file, 0);
  H5Fclose(file);
}

void rehearse_in_child(const std::string& path, const std::function<void()>& read) {
  if (in_rehearsal || !rehearsal_enabled) return;
  silence_errors();
  const pid_t child = fork();
  if (child < 0) return;  // no process to spare: the reader goes on without the defence
  if (child == 0) {
    in_rehearsal = true;
    default_crash_handlers();
    try {
      read();
    } catch (...) {}
    _exit(0);  // no exit handlers, no destructors of the parent's objects
  }
  const auto deadline = std::chrono::steady_clock::now() + kRehearsalLimit;
  int status = 0;
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0) return;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      throw FormatError(path, "is corrupt: reading it did not finish in 30 s (nothing was read from it)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
  // The child leaves with 0 whatever the read threw; anything else is a
  // crash: a signal, or a sanitizer's report of one (it exits with 1).
  if (WIFSIGNALED(status))
    throw FormatError(path, std::string("is corrupt: reading it crashed the HDF5 library (") +
                                strsignal(WTERMSIG(status)) + ", in a child process; nothing was read from it)");
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    throw FormatError(path, "is corrupt: reading it crashed the HDF5 library (exit status " +
                                std::to_string(WEXITSTATUS(status)) +
                                ", in a child process; nothing was read from it)");
}

}  // namespace nanscope::format::h5

namespace nanscope::format {

void set_rehearsal(bool on) { h5::rehearsal_enabled = on; }
bool rehearsal_on() { return h5::rehearsal_enabled; }

}  // namespace nanscope::format
