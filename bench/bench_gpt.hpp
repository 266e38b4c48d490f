#pragma once
// The benchmarks' GPT: 4 blocks x 128 wide, 64 tokens, on the built-in text,
// with nanscope-train's runtime set-up (threads, OpenBLAS on one thread,
// seed), so its steps run as nanscope-train's do.
#include "nanscope/models/gpt.hpp"
#include "nanscope/trainer/data.hpp"
#include "nanscope/trainer/setup.hpp"

namespace nanscope::bench {

using namespace nanscope::trainer;

inline GptConfig gpt_config(int threads) {
  TrainOptions runtime;
  runtime.threads = threads;
  configure_runtime(runtime, at::kCPU);
  GptConfig config;
  config.n_layer = 4;
  config.n_embd = 128;
  config.n_head = 4;
  config.seq_len = 64;
  return config;
}

}  // namespace nanscope::bench
