#pragma once
// A snapshot: everything needed to replay one step offline, with no other
// file (schema in docs/format.md). Written by the probe on a
// non-finite step, read by nanscope-replay.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/format/capture.hpp"

namespace nanscope::probe {

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

struct SnapshotContents {
  int64_t step = 0;
  // The model: a built-in's name and sizes, or TorchScript bytes.
  std::string model_name;  // "mlp", "gpt", "torchscript"
  std::map<std::string, int64_t> model_hparams;
  std::string torchscript_bytes;
  NamedTensorList parameters;  // weights before the step
  NamedTensorList buffers;
  // Optimizer state before the step, per parameter name and slot
  // ("blocks.0.attn.qkv.weight/exp_avg").
  std::string optimizer;  // "adamw" | "sgd"
  NamedTensorList optimizer_state;
  at::Tensor inputs, targets, batch_rows;
  at::Tensor cpu_rng_state;  // at::Generator get_state() bytes
  std::string precision;     // "fp32" | "bf16" | "fp16"
  double loss_scale = 1;
  double lr = 0;
  double clip = 0;
  std::map<std::string, std::string> config;  // the run's config, as in run.h5
  format::Capture capture;
  std::vector<std::string> layer_names;
  std::vector<float> layer_grad_norm;  // at the failing step (NaN/Inf kept)
};

// Throws format::FormatError naming the file.
void write_snapshot(const std::string& path, const SnapshotContents& snapshot);
SnapshotContents read_snapshot(const std::string& path);

// snapshots/step-0000042.h5 under a run directory.
std::string snapshot_path(const std::string& run_dir, int64_t step, int rank = 0, int world_size = 1);

}  // namespace nanscope::probe
