#pragma once
// Run files and snapshots with known contents, written through the format
// library (no LibTorch, no trainer), for the viewer's tests.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "nanscope/format/archive.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/run_layout.hpp"
#include "nanscope/format/snapshot_summary.hpp"
#include "nanscope/format/version.hpp"

namespace nanscope::test {

inline format::RunHeader synthetic_header(size_t layers) {
  format::RunHeader header;
  for (size_t l = 0; l < layers; ++l) header.layer_names.push_back("blocks." + std::to_string(l) + ".fc");
  header.record_act_absmax = true;
  header.config = {{"model", "synthetic"}};
  return header;
}

// Step s: loss falls, layer l's norm is (l+1)/10 growing slowly; step
// `nan_step` has a NaN loss, grad norm and layer-2 norm. Only an fp16 step has
// a loss scaler (2^16 here); any other records a scale of 1.
inline format::StepRow synthetic_row(int64_t s, size_t layers, int64_t nan_step = -1,
                                     format::Precision amp = format::Precision::bf16) {
  format::StepRow row;
  row.step = s;
  row.loss = 5.0 * std::exp(-0.01 * double(s)) + 0.1;
  row.lr = 1e-3;
  row.loss_scale = amp == format::Precision::fp16 ? 65536 : 1;
  row.grad_norm = 1.0 + 0.001 * double(s);
  row.amp = amp;
  row.step_time = 0.01;
  for (size_t l = 0; l < layers; ++l) {
    row.layer_grad_norm.push_back(float((l + 1) * 0.1 * (1.0 + 0.002 * double(s))));
    row.layer_act_absmax.push_back(s % 5 == 0 ? float(10 * (l + 1)) : NAN);
  }
  if (s == nan_step) {
    row.loss = NAN;
    row.grad_norm = NAN;
    row.skipped = true;
    if (layers > 2) row.layer_grad_norm[2] = NAN;
  }
  return row;
}

inline void write_synthetic_run(const std::string& path, int64_t steps, size_t layers, int64_t nan_step,
                                format::Precision amp = format::Precision::bf16) {
  format::RunWriter writer(path, synthetic_header(layers), 64);
  for (int64_t s = 0; s < steps; ++s) {
    writer.append(synthetic_row(s, layers, nan_step, amp));
    if (s == nan_step) writer.event(s, format::EventKind::skip, "non-finite loss; step skipped");
  }
}

// A long run (the viewer reads it through its overview): synthetic_row's
// values, one NaN step (loss, grad norm and layer 2's norm), written in
// large batches so a million rows take seconds.
inline void write_long_synthetic_run(const std::string& path, int64_t steps, size_t layers, int64_t nan_step) {
  format::RunWriter writer(path, synthetic_header(layers), 8192);
  for (int64_t s = 0; s < steps; ++s) writer.append(synthetic_row(s, layers, nan_step));
}

// A run that warned and rolled back: a warning naming blocks.1.fc at step 40,
// steps 41-60 with a loss of 1e6 (a burst that wrecked the weights), and a
// rollback at step 60 back to the state after step 40; then the curve goes on.
inline void write_synthetic_rollback_run(const std::string& path, int64_t steps, size_t layers) {
  format::RunWriter writer(path, synthetic_header(layers), 64);
  for (int64_t s = 0; s < steps; ++s) {
    format::StepRow row = synthetic_row(s, layers);
    if (s > 40 && s <= 60) row.loss = 1e6;
    writer.append(row);
    if (s == 40) writer.event(s, format::EventKind::warning, "layer_grad_norm in 'blocks.1.fc': 41.2 against 1.3");
    if (s == 60)
      writer.event(s, format::EventKind::rollback,
                   "to step 40: steps 41-60 do not count and their batches are skipped; LR x 0.5 -> 0.0005");
  }
}

// Rank `rank` of a `world_size`-process run, as nanscope-train writes it: at
// `nan_step` every rank skips (the all-reduced global grad norm is NaN on all)
// but only `nan_rank`'s own layer norms are NaN, and every rank records the
// event format::to_string(format::EventKind::first_nonfinite) with `first_ranks_text` (none when it is "").
// Each rank's loss differs a little (its own batches).
inline void write_synthetic_rank_run(const std::string& path, int rank, int world_size, int64_t steps, size_t layers,
                                     int nan_rank, int64_t nan_step, const std::string& first_ranks_text,
                                     size_t flush_every = 64) {
  format::RunHeader header = synthetic_header(layers);
  header.config["rank"] = std::to_string(rank);
  header.config["world_size"] = std::to_string(world_size);
  format::RunWriter writer(path, header, flush_every);
  for (int64_t s = 0; s < steps; ++s) {
    format::StepRow row = synthetic_row(s, layers);
    row.loss *= 1.0 + 0.05 * rank;
    if (s == nan_step) {
      row.skipped = true;
      row.grad_norm = NAN;
      if (rank == nan_rank)
        for (float& norm : row.layer_grad_norm) norm = NAN;
    }
    writer.append(row);
    if (s != nan_step) continue;
    writer.event(s, format::EventKind::skip, "non-finite grads; step skipped");
    writer.event(s, format::EventKind::nonfinite_ranks, std::to_string(nan_rank));
    if (!first_ranks_text.empty()) writer.event(s, format::EventKind::first_nonfinite, first_ranks_text);
    if (rank == nan_rank) {
      writer.event(s, format::EventKind::first_birth, "nan at aten::log in 'blocks.1.fc' (forward)");
      writer.event(s, format::EventKind::snapshot, "snapshot written");
    }
  }
}

// The path of rank `rank`'s snapshot of `step` in run directory `dir`.
inline std::string rank_snapshot_path(const std::string& dir, int rank, int world_size, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%07lld.h5", static_cast<long long>(step));
  return (std::filesystem::path(format::snapshot_dir(dir, rank, world_size)) / name).string();
}

// A snapshot as the probe writes it (the parts the viewer reads): a NaN born
// in aten::log in blocks.1.fc (in batch row 2 unless told), a two-op trail, layer norms with a NaN, and,
// when `replayed`, replay's record. `birth_rows`: the batch rows the birth
// made non-finite (Birth::rows); `batch_rows`: each batch row's data-set row
// (-1: unknown).
inline void write_synthetic_snapshot(const std::string& path, int64_t step, size_t layers, bool replayed,
                                     const std::vector<int64_t>& birth_rows = {2},
                                     const std::vector<int64_t>& batch_rows = {7, 3, 11, 5}) {
  format::Archive archive = format::Archive::create(path, format::kSnapshotFileKind);
  format::Group root = archive.root();
  root.set_attr("step", step);
  root.set_attr("precision", std::string("bf16"));
  root.set_attr("loss_scale", 1.0);
  root.set_attr("lr", 1e-3);
  root.set_attr("clip", 1.0);
  root.group("model").set_attr("name", std::string("synthetic"));
  format::Capture capture;
  capture.reproduced = true;
  capture.ops_seen = 42;
  format::OpRecord before;
  before.index = 40;
  before.op = "aten::gelu";
  before.phase = format::Phase::forward;
  before.module = "blocks.1.fc";
  before.output = {"bfloat16", {16, 64}, -0.2, 3.0, 3.0, 0, 0};
  format::Birth birth;
  birth.op = before;
  birth.op.index = 41;
  birth.op.op = "aten::log";
  birth.op.output = {"bfloat16", {16, 64}, -14, 1.1, 14, 37, 0};
  birth.kind = format::BirthKind::nan;
  birth.inputs = {before.output};
  birth.rows = birth_rows;
  capture.first_birth = capture.first_nan_birth = birth;
  capture.trail = {before, birth.op};
  format::write_capture(root.group("capture"), capture);
  format::Group layer_group = root.group("layers");
  layer_group.set_attr("count", int64_t(layers));
  std::vector<float> norms;
  for (size_t l = 0; l < layers; ++l) {
    layer_group.set_attr("name_" + std::to_string(l), "blocks." + std::to_string(l) + ".fc");
    norms.push_back(l == 1 ? NAN : float(0.1 * (l + 1)));
  }
  layer_group.put_tensor("grad_norm", format::DType::float32, {int64_t(layers)}, norms.data());
  root.group("batch").put_tensor("rows", format::DType::int64, {int64_t(batch_rows.size())}, batch_rows.data());
  if (replayed) {
    format::ReplayRecord record;
    record.verdict = format::Verdict::model_or_data;
    record.category = format::Category::log_nonpositive;
    record.suggestion = "clamp the input of aten::log in blocks.1.fc";
    record.reproduced_count = 3;
    record.repeats = 3;
    record.samples = "2";
    format::write_replay_record(root, record);
  }
  archive.close();
}

// A whole `world_size`-process run directory: every rank's run file and
// `nan_rank`'s snapshot of `nan_step` in snapshots/rank-R/.
inline void write_synthetic_rank_dir(const std::string& dir, int world_size, int64_t steps, size_t layers, int nan_rank,
                                     int64_t nan_step, const std::string& first_ranks_text) {
  std::filesystem::create_directories(dir);
  for (int rank = 0; rank < world_size; ++rank)
    write_synthetic_rank_run((std::filesystem::path(dir) / format::run_file_name(rank, world_size)).string(), rank,
                             world_size, steps, layers, nan_rank, nan_step, first_ranks_text);
  const std::string snapshot = rank_snapshot_path(dir, nan_rank, world_size, nan_step);
  std::filesystem::create_directories(std::filesystem::path(snapshot).parent_path());
  write_synthetic_snapshot(snapshot, nan_step, layers, false);
}

}  // namespace nanscope::test
