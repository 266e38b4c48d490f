#pragma once
// The parts of a snapshot a person reads (how the step ran, what capture
// found, the batch's rows, per-layer norms, replay's verdict), without the
// weights and without LibTorch: the viewer's view of a snapshot. The probe
// writes snapshots; replay appends its record through write_replay_record.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/format/kernel_trials.hpp"
#include "nanscope/format/precision_trail.hpp"

namespace nanscope::format {

// What nanscope-replay found, stored as /replay (docs/format.md).
struct ReplayRecord {
  Verdict verdict = Verdict::unknown;
  Category category = Category::unknown;
  std::string suggestion;
  int64_t reproduced_count = 0, repeats = 0;
  bool fp32_finite = false;
  std::string anomaly;
  std::string fp32_modules;  // comma-separated module paths
  std::string samples;       // comma-separated batch rows
  // The model's own 16-bit type ("bfloat16", "float16") when its weights
  // were 16-bit: the step computed in it, and the fp32 re-run widened them.
  // "" for wider weights (and in files written before it was recorded).
  std::string widened_weights;
  Capture fp32_capture;
  // A precision verdict's op-by-op comparison with fp32 (from format 1.13).
  std::optional<PrecisionTrail> precision_trail;
  // The step re-run with the born op's other kernels (from format 1.14).
  std::optional<KernelTrials> kernel_trials;
};

// Replaces /replay in an archive opened for writing.
void write_replay_record(const Group& root, const ReplayRecord& record);
// Nothing when the snapshot was never replayed.
std::optional<ReplayRecord> read_replay_record(const Group& root);

// What a snapshot says about its step, without its tensors: written by the
// probe (write_snapshot_header, beside the tensors), read by the viewer and
// by the probe's own reader. The probe's SnapshotContents adds the tensors.
struct SnapshotHeader {
  int64_t step = 0;
  Precision precision = Precision::unknown;
  double loss_scale = 1, lr = 0, clip = 0;
  std::string model_name;  // stored as /model/name, beside the model's tensors
  Origin origin = Origin::unknown;
  std::map<std::string, std::string> config;
  Capture capture;
  std::vector<std::string> layer_names;
  std::vector<float> layer_grad_norm;  // empty when not recorded
};

// The command that replays this snapshot (kept at `path`): nanscope-replay,
// or for a Python run `python -m nanscope replay` with the interpreter it was
// trained with (its config's "python").
std::string replay_command(const SnapshotHeader& header, const std::string& path);

// Writes the header's attributes and groups (not /model/name: the model's
// writer puts it with the model).
void write_snapshot_header(const Group& root, const SnapshotHeader& header);

struct SnapshotSummary : SnapshotHeader {
  std::string path;
  std::vector<int64_t> batch_rows;  // each batch row's index in the data set
  std::vector<int64_t> input_shape;
  std::string input_dtype;
  std::optional<ReplayRecord> replay;
  // Code the file carries (snapshot_inventory.hpp): the TorchScript program's
  // size in bytes, and how many of the batch's objects are Python pickles.
  int64_t program_bytes = 0;
  int64_t pickled_batch_objects = 0;
};

// Throws FormatError naming the file for a missing, foreign or malformed snapshot.
SnapshotSummary read_snapshot_summary(const std::string& path);

// What the snapshot's step computed in: its precision ("bf16"), or for a
// model of its own 16-bit weights under autocast off "bfloat16, the model's
// own weights" (step_precision_name): the type as the guard wrote it (config
// "own_16bit"), or as replay found it (snapshots written before the guard did).
std::string step_precision_text(const SnapshotSummary& snapshot);
// The same for a step at `precision` of a model whose own 16-bit type is
// `own_16bit` ("" for wider weights): what replay's report heads with.
std::string step_precision_text(Precision precision, const std::string& own_16bit);

}  // namespace nanscope::format
