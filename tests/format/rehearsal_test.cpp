// The readers' rehearsal as a caller reading behind its child: each part is
// read here only after the child read it and went on, a child that crashes
// stops the caller before the part that crashed it, and a child that
// overruns its memory is stopped while the caller is busy reading.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/test_support.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/rehearsal.hpp"

using namespace nanscope::format;
using nanscope::test::TempDir;

namespace {

// A file for the bound to be taken from: its bytes are never read here.
std::string small_file(const TempDir& dir) {
  const std::string path = dir.file("run.h5");
  std::ofstream(path) << "not read";
  return path;
}

// Written by the child, read by the caller: the last part the child
// finished (a page shared before the fork).
struct SharedCount {
  volatile int* finished = nullptr;
  SharedCount() {
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    finished = static_cast<volatile int*>(page);
    *finished = -1;
  }
  ~SharedCount() { munmap(const_cast<int*>(finished), 4096); }
};

}  // namespace

// The child is slow (20 ms a part): a caller that did not wait would begin
// a part the child has not finished.
TEST(Rehearsal, TheCallerReadsEachPartOnlyAfterTheChildHasReadIt) {
  TempDir dir;
  const std::string path = small_file(dir);
  const pid_t caller = getpid();
  SharedCount child;
  std::vector<int> parts_here, finished_in_child;
  read_under_one_rehearsal(path, [&] {
    for (int part = 0; part < 5; ++part) {
      rehearsal_checkpoint();
      if (getpid() == caller) {
        parts_here.push_back(part);
        finished_in_child.push_back(int(*child.finished));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        *child.finished = part;
      }
    }
  });
  EXPECT_EQ(parts_here, (std::vector<int>{0, 1, 2, 3, 4}));
  for (size_t part = 0; part < parts_here.size(); ++part)
    EXPECT_GE(finished_in_child[part], int(part)) << "part " << part << " read here before the child finished it";
}

TEST(Rehearsal, AChildThatCrashesInAPartStopsTheCallerBeforeThatPart) {
  TempDir dir;
  const std::string path = small_file(dir);
  const pid_t caller = getpid();
  std::vector<int> parts_here;
  try {
    read_under_one_rehearsal(path, [&] {
      for (int part = 0; part < 5; ++part) {
        rehearsal_checkpoint();
        if (getpid() != caller && part == 3) std::raise(SIGSEGV);  // the bytes that crash HDF5
        if (getpid() == caller) parts_here.push_back(part);
      }
    });
    ADD_FAILURE() << "the child's crash was not reported";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("crashed the HDF5 library"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parts_here, (std::vector<int>{0, 1, 2}));
}

// The child's memory is kept to its bound while the caller is busy with a
// part of its own (it polls only between parts): without a watch in the
// background the child would reach the end of its read and say it was done.
TEST(Rehearsal, AChildPastItsMemoryBoundIsStoppedWhileTheCallerReads) {
  TempDir dir;
  const std::string path = small_file(dir);
  const pid_t caller = getpid();
  constexpr size_t kMiB = size_t(1) << 20;
  constexpr size_t kPastTheBound = 1536;  // MiB: the bound for a small file is 256 MiB
  const auto start = std::chrono::steady_clock::now();
  try {
    read_under_one_rehearsal(path, [&] {
      rehearsal_checkpoint();  // part 0: nothing in the child, a long read here
      if (getpid() == caller) std::this_thread::sleep_for(std::chrono::seconds(2));
      rehearsal_checkpoint();  // part 1: the child's memory grows past its bound
      if (getpid() != caller) {
        std::vector<char*> held;
        for (size_t mib = 0; mib < kPastTheBound; ++mib) {
          held.push_back(new char[kMiB]);
          std::memset(held.back(), 1, kMiB);
        }
      }
    });
    ADD_FAILURE() << "a child past its memory bound was let finish";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("needed more than"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));  // found after part 0 here
}

TEST(Rehearsal, AReadThatThrowsInBothIsTheCallersOwnError) {
  TempDir dir;
  const std::string path = small_file(dir);
  try {
    read_under_one_rehearsal(path, [&] {
      rehearsal_checkpoint();
      throw FormatError(path, "has no /steps");
    });
    ADD_FAILURE() << "the read's error was lost";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("has no /steps"), std::string::npos) << e.what();
  }
}
