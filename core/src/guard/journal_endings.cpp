// The record of a C++ program that ends badly. A run file buffers up to 16
// rows (or 2 s of them) between flushes; Python writes them and closes the
// file at its exit, whichever way the loop ended. A C++ program has no such
// exit for an uncaught exception (std::terminate runs no destructors) or
// Ctrl-C (SIGINT ends the process at once), so every open journal is
// registered here, and its file is closed as Python's is (rows written, the
// mark for writing cleared, so plain HDF5 readers open it):
//  - a terminate handler closes them, then calls the one before it;
//  - where the program left Ctrl-C to its default, the first Ctrl-C is held
//    until the guard's next step boundary, which closes them and ends the
//    process by SIGINT as Ctrl-C would have; a second Ctrl-C ends it at once.
// SIGKILL cannot be met: the rows since the last flush (64 rows, 2 s) go.
#include <atomic>
#include <csignal>
#include <exception>
#include <mutex>
#include <set>

#include "guard/journal_endings.hpp"
#include "nanscope/core/journal.hpp"

namespace nanscope {

namespace {

std::mutex journals_mutex;
std::set<Journal*>& open_journals() {
  static std::set<Journal*> journals;
  return journals;
}

std::terminate_handler previous_terminate = nullptr;
std::atomic<bool> interrupted{false};
bool holding_interrupts = false;

// For a process about to die: nothing writes to them after.
void close_all() noexcept {
  std::lock_guard<std::mutex> lock(journals_mutex);
  for (Journal* journal : open_journals()) {
    try {
      journal->close_file();
    } catch (...) {  // a full disk: the rest still get their chance
    }
  }
}

void on_terminate() {
  close_all();
  if (previous_terminate) previous_terminate();
  std::abort();
}

void hold_interrupt(int) {
  if (interrupted.exchange(true)) {  // the second Ctrl-C: now
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

}  // namespace

void register_journal(Journal* journal) {
  std::lock_guard<std::mutex> lock(journals_mutex);
  if (open_journals().empty()) {
    static std::once_flag once;
    std::call_once(once, [] { previous_terminate = std::set_terminate(on_terminate); });
    // Only a default Ctrl-C: a program (or Python) with a handler of its own keeps it.
    void (*was)(int) = std::signal(SIGINT, hold_interrupt);
    holding_interrupts = was == SIG_DFL;
    if (!holding_interrupts) std::signal(SIGINT, was);
  }
  open_journals().insert(journal);
}

void unregister_journal(Journal* journal) {
  std::lock_guard<std::mutex> lock(journals_mutex);
  open_journals().erase(journal);
  if (open_journals().empty() && holding_interrupts) {
    std::signal(SIGINT, SIG_DFL);
    holding_interrupts = false;
    if (interrupted.exchange(false)) std::raise(SIGINT);  // held for a step that never came
  }
}

int open_journals_named(const std::string& model_name) {
  std::lock_guard<std::mutex> lock(journals_mutex);
  int named = 0;
  for (const Journal* journal : open_journals()) named += journal->model_name() == model_name;
  return named;
}

void end_if_interrupted() {
  if (!interrupted.load(std::memory_order_relaxed)) return;
  close_all();
  std::signal(SIGINT, SIG_DFL);
  std::raise(SIGINT);
}

}  // namespace nanscope
