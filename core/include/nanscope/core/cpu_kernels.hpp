#pragma once
// Which CPU kernels LibTorch runs, from the environment.
//
// NANSCOPE_ONEDNN=off: LibTorch's own kernels instead of oneDNN's for bf16
// matmuls and convolutions. LibTorch 1.13 hands bf16 work to oneDNN only on
// CPUs with AVX-512 (BW, VL, DQ); elsewhere its own gemm runs, which rounds
// differently. This reproduces such a CPU's arithmetic on any machine: a run
// from a laptop replayed on a server, or the test suite checking that no
// expectation holds only for this CPU's kernels (scripts/dispatch-limits.sh).
// Capping oneDNN's ISA instead (ONEDNN_MAX_CPU_ISA=AVX2) does not: LibTorch
// still asks oneDNN, which then has no bf16 kernel to give.
namespace nanscope {

// Reads NANSCOPE_ONEDNN once per process; cheap to call again.
void use_cpu_kernels_from_environment();

}  // namespace nanscope
