#include "nanscope/core/cpu_kernels.hpp"

#include <ATen/Context.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace nanscope {

void use_cpu_kernels_from_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* onednn = std::getenv("NANSCOPE_ONEDNN");
    if (onednn && std::string(onednn) == "off") at::globalContext().setUserEnabledMkldnn(false);
  });
}

}  // namespace nanscope
