#pragma once
// Ctrl-C during a run: the handler only sets a flag, and the loop stops after
// the step it is in (every rank after the same step). The previous handler
// comes back when the run ends, however it ends (an exception included).
#include <csignal>

namespace nanscope::trainer {

class InterruptFlag {
 public:
  InterruptFlag();
  ~InterruptFlag();
  InterruptFlag(const InterruptFlag&) = delete;
  InterruptFlag& operator=(const InterruptFlag&) = delete;
  bool raised() const;

 private:
  void (*previous_)(int);
};

}  // namespace nanscope::trainer
