#pragma once
// A small decoder-only transformer (GPT-2 shape: pre-LN, causal attention,
// GELU MLP, learned positions), byte-level by default.
#include <memory>

#include "nanscope/core/model.hpp"

namespace nanscope {

struct GptConfig {
  int64_t vocab_size = 256;
  int64_t seq_len = 64;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 64;
};

// Throws std::invalid_argument for inconsistent sizes (n_embd % n_head != 0...).
std::unique_ptr<TrainableModel> make_gpt(const GptConfig& config, uint64_t seed);
GptConfig gpt_config_from(const ModelSpec& spec);

}  // namespace nanscope
