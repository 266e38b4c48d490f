#include "nanscope/trainer/interrupt.hpp"

#include <atomic>

namespace nanscope::trainer {

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted = true; }
}  // namespace

InterruptFlag::InterruptFlag() {
  g_interrupted = false;
  previous_ = std::signal(SIGINT, on_interrupt);
}

InterruptFlag::~InterruptFlag() { std::signal(SIGINT, previous_); }

bool InterruptFlag::raised() const { return g_interrupted.load(); }

}  // namespace nanscope::trainer
