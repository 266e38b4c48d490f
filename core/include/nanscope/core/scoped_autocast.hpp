#pragma once
// Autocast for one micro-batch's forward and loss at the guard's precision
// (nothing at fp32), undone at the end of its scope: StepGuard::autocast().
#include <c10/core/DeviceType.h>

#include <memory>

#include "nanscope/core/precision.hpp"

namespace nanscope {

class ScopedAutocast {
 public:
  ScopedAutocast(at::DeviceType device, Amp amp);
  ~ScopedAutocast();
  ScopedAutocast(ScopedAutocast&& other) noexcept;
  ScopedAutocast(const ScopedAutocast&) = delete;
  ScopedAutocast& operator=(const ScopedAutocast&) = delete;
  ScopedAutocast& operator=(ScopedAutocast&&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace nanscope
