#pragma once
// NVTX ranges for Nsight Systems timelines: NANSCOPE_NVTX_RANGE("forward")
// marks the rest of the enclosing block. Built with NVTX3 (header-only, from
// the CUDA toolkit) when CMake finds it; compiled out otherwise.
#ifdef NANSCOPE_HAVE_NVTX3
#include <nvtx3/nvToolsExt.h>

namespace nanscope::probe {
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};
}  // namespace nanscope::probe

#define NANSCOPE_NVTX_RANGE(name) ::nanscope::probe::NvtxRange NANSCOPE_NVTX_CONCAT(nanscope_nvtx_, __LINE__)(name)
#define NANSCOPE_NVTX_CONCAT_INNER(a, b) a##b
#define NANSCOPE_NVTX_CONCAT(a, b) NANSCOPE_NVTX_CONCAT_INNER(a, b)
#else
#define NANSCOPE_NVTX_RANGE(name) ((void)0)
#endif
