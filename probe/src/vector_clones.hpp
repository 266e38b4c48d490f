#pragma once
// The host scans' loops (probe/src/finiteness.cpp, host_norms.cpp) are built
// twice: for AVX2, taken where the CPU has it, and for the baseline x86-64
// the library is built for (SSE2). A loop over a small tensor is where a
// clean step's checks spend their time, and the baseline build vectorizes
// some of them poorly (an unsigned max is emulated, about five times slower
// than LibTorch's own kernels).
#if defined(__GNUC__) && defined(__x86_64__)
#define NANSCOPE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define NANSCOPE_VECTOR_CLONES
#endif
