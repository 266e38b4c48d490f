#pragma once
// One decision for nanscope's own tools (nanscope-train, replay_main:
// nanscope-replay or a program's own replay command line, and
// `python3 -m nanscope replay`):
// Debian's OpenBLAS, the pthread build behind libblas.so.3, keeps its own
// thread pool, as many threads as cores, spinning while idle, which
// at::set_num_threads does not reach; beside ATen's OpenMP pool on the same
// cores the two stall each other. Measured on 2 cores: nanscope-train's gpt
// 4x128 step (batch 16, 2 ATen threads) 126-163 ms with OpenBLAS's pool, 72-82
// ms with OpenBLAS on one thread (two ranks on 2 cores: 0.98x one rank, 1.34x
// after); nanscope-replay of a catalog snapshot under LibTorch 2.14 (Debian
// testing), 4.1 s against 1.7 s. So OpenBLAS runs single-threaded and ATen's
// pool does the parallel work. A training loop of yours decides for its own
// process: the guard never calls this.

namespace nanscope {

// OpenBLAS on one thread, unless the user set OPENBLAS_NUM_THREADS. Found at
// run time: the BLAS is chosen by Debian's alternatives and may not be OpenBLAS.
void keep_blas_single_threaded();

}  // namespace nanscope
