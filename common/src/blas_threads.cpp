#include "nanscope/common/blas_threads.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace nanscope {

void keep_blas_single_threaded() {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(1);
}

}  // namespace nanscope
