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
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/probe/batch.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope::probe {

// A snapshot whole: the header every reader sees (step, precision, loss scale,
// LR, clip, model name, config, capture, per-layer norms) and the tensors that
// let nanscope-replay rebuild the step.
struct SnapshotContents : format::SnapshotHeader {
  // The model: a built-in's sizes, or TorchScript bytes (its name is the header's).
  std::map<std::string, int64_t> model_hparams;
  std::string torchscript_bytes;
  NamedTensorList parameters;  // weights before the step
  NamedTensorList buffers;
  // Optimizer state before the step, per parameter name and slot
  // ("blocks.0.attn.qkv.weight/exp_avg").
  std::string optimizer;  // "adamw" | "sgd" | yours
  NamedTensorList optimizer_state;
  // The step's batch (a step of several micro-batches: the one its first
  // birth was in), as the loop gave it: (inputs, targets), or a nested batch's
  // tensors and structure; its rows along batch.row_dim.
  Batch batch;
  at::Tensor batch_rows;
  at::Tensor cpu_rng_state;  // at::Generator get_state() bytes
  // From 1.9 the capture's nonfinite_weights is the guard's own check of the
  // weights as the step began (the parameters above may be a closure
  // optimizer's trial point); an older snapshot's say nothing of it.
  bool weights_checked = false;
};

// Throws format::FormatError naming the file.
void write_snapshot(const std::string& path, const SnapshotContents& snapshot);
SnapshotContents read_snapshot(const std::string& path);

// The tensors of other models the step's loss ran (a GAN's critic in the
// generator's loss), named "LABEL.path" ("Discriminator.main.0.weight"), so
// a replay can run that loss as the step did: /other_modules (format 1.5).
// Added to a written snapshot by the guard that ran them (Python finds them
// by its hooks and labels them by class; C++ is told, StepGuard::add_other_model).
void append_other_modules(const std::string& path, const NamedTensorList& tensors);
// Empty for a snapshot without them (or from before 1.5).
NamedTensorList read_other_modules(const std::string& path);

// snapshots/step-0000042.h5 under a run directory.
std::string snapshot_path(const std::string& run_dir, int64_t step, int rank = 0, int world_size = 1);

}  // namespace nanscope::probe
