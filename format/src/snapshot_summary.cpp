#include "nanscope/format/snapshot_summary.hpp"

#include "nanscope/format/advice_words.hpp"

#include <cstring>

#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"
#include "rehearsal.hpp"

namespace nanscope::format {

namespace {

// The Python side writes a batch's structure as JSON in which an object that
// is not a tensor or a JSON value is {"p": "<base64 pickle>"}; a string that
// holds the same characters has its quotes escaped, so this counts pickles only.
int64_t pickled_objects(const std::string& structure) {
  int64_t n = 0;
  for (size_t at = structure.find("{\"p\": "); at != std::string::npos; at = structure.find("{\"p\": ", at + 1)) ++n;
  return n;
}

}  // namespace

void write_replay_record(const Group& root, const ReplayRecord& r) {
  root.remove("replay");
  Group g = root.group("replay");
  g.set_word("verdict", r.verdict);
  g.set_word("category", r.category);
  g.set_attr("suggestion", r.suggestion);
  g.set_attr("reproduced_count", r.reproduced_count);
  g.set_attr("repeats", r.repeats);
  g.set_attr("fp32_finite", int64_t(r.fp32_finite));
  g.set_attr("anomaly", r.anomaly);
  g.set_attr("fp32_modules", r.fp32_modules);
  g.set_attr("samples", r.samples);
  g.set_attr("widened_weights", r.widened_weights);
  write_capture(g.group("fp32_capture"), r.fp32_capture);
  if (r.precision_trail) write_precision_trail(g.group("precision_trail"), *r.precision_trail);
  if (r.kernel_trials) {
    g.set_attr("kernel_op", r.kernel_trials->op);
    g.set_attr("kernel_trials", kernel_trials_value(*r.kernel_trials));
  }
}

std::optional<ReplayRecord> read_replay_record(const Group& root) {
  if (!root.has("replay")) return std::nullopt;
  Group g = root.group("replay");
  ReplayRecord r;
  r.verdict = g.word<Verdict>("verdict");
  r.category = g.word<Category>("category");
  r.suggestion = g.attr_string("suggestion");
  r.reproduced_count = g.attr_int("reproduced_count");
  r.repeats = g.attr_int("repeats");
  r.fp32_finite = g.attr_int("fp32_finite") != 0;
  r.anomaly = g.attr_string("anomaly");
  r.fp32_modules = g.attr_string("fp32_modules");
  r.samples = g.attr_string("samples");
  if (g.has_attr("widened_weights")) r.widened_weights = g.attr_string("widened_weights");
  if (g.has("fp32_capture")) r.fp32_capture = read_capture(g.group("fp32_capture"));
  if (g.has("precision_trail")) r.precision_trail = read_precision_trail(g.group("precision_trail"));  // from 1.13
  if (g.has_attr("kernel_trials"))                                                                     // from 1.14
    r.kernel_trials =
        parse_kernel_trials(g.has_attr("kernel_op") ? g.attr_string("kernel_op") : "", g.attr_string("kernel_trials"));
  return r;
}

std::string step_precision_text(Precision precision, const std::string& own_16bit) {
  const bool own_weights = precision == Precision::fp32 && !own_16bit.empty();
  return step_precision_name(precision, own_16bit) + (own_weights ? ", the model's own weights" : "");
}

std::string step_precision_text(const SnapshotSummary& s) {
  const auto written = s.config.find("own_16bit");
  if (written != s.config.end()) return step_precision_text(s.precision, written->second);
  return step_precision_text(s.precision, s.replay ? s.replay->widened_weights : "");
}

std::string replay_command(const SnapshotHeader& header, const std::string& path) {
  const auto python = header.config.find("python");
  return replay_command(header.origin, path, python == header.config.end() ? "" : python->second);
}

void write_snapshot_header(const Group& root, const SnapshotHeader& h) {
  root.set_attr("step", h.step);
  root.set_word("precision", h.precision);
  root.set_attr("loss_scale", h.loss_scale);
  root.set_attr("lr", h.lr);
  root.set_attr("clip", h.clip);
  root.set_word("origin", h.origin);
  Group config = root.group("config");
  for (const auto& [k, v] : h.config) config.set_attr(k, v);
  write_capture(root.group("capture"), h.capture);
  Group layers = root.group("layers");
  layers.set_attr("count", int64_t(h.layer_names.size()));
  for (size_t i = 0; i < h.layer_names.size(); ++i) layers.set_attr("name_" + std::to_string(i), h.layer_names[i]);
  if (!h.layer_grad_norm.empty())
    layers.put_tensor("grad_norm", DType::float32, {int64_t(h.layer_grad_norm.size())}, h.layer_grad_norm.data());
}

SnapshotSummary read_snapshot_summary(const std::string& path) {
  h5::rehearse_in_child(path, [&] { read_snapshot_summary(path); });
  Archive archive = Archive::open(path, kSnapshotFileKind);
  Group root = archive.root();
  SnapshotSummary s;
  s.path = path;
  s.step = root.attr_int("step");
  s.precision = root.word<Precision>("precision");
  s.loss_scale = root.attr_double("loss_scale");
  s.lr = root.attr_double("lr");
  s.clip = root.has_attr("clip") ? root.attr_double("clip") : 0.0;
  if (root.has_attr("origin")) s.origin = root.word<Origin>("origin");
  if (root.has("model")) s.model_name = root.group("model").attr_string("name");
  if (root.has("config")) {
    Group config = root.group("config");
    for (const auto& key : config.attr_names()) s.config[key] = config.attr_string(key);
  }
  if (!root.has("capture")) throw FormatError(path, "/capture missing");
  s.capture = read_capture(root.group("capture"));
  if (root.has("layers")) {
    Group layers = root.group("layers");
    const int64_t n = layers.attr_int("count");
    for (int64_t i = 0; i < n; ++i) s.layer_names.push_back(layers.attr_string("name_" + std::to_string(i)));
    if (layers.has("grad_norm")) {
      TensorData t = layers.tensor("grad_norm");
      if (t.dtype != DType::float32 || t.numel() != n)
        throw FormatError(path, "/layers/grad_norm is not float32[" + std::to_string(n) + "]");
      s.layer_grad_norm.resize(n);
      std::memcpy(s.layer_grad_norm.data(), t.bytes.data(), n * sizeof(float));
    }
  }
  if (root.has("batch")) {
    Group batch = root.group("batch");
    if (batch.has("rows")) s.batch_rows = int_values(batch.tensor("rows"), path, "/batch/rows");
    if (batch.has("inputs")) {
      TensorData inputs = batch.tensor("inputs");
      s.input_shape = inputs.shape;
      s.input_dtype = dtype_name(inputs.dtype);
    }
  }
  s.replay = read_replay_record(root);
  // The code the file carries, read last.
  if (root.has("model") && root.group("model").has("torchscript"))
    s.program_bytes = root.group("model").blob_size("torchscript");
  if (root.has("batch") && root.group("batch").has_attr("structure"))
    s.pickled_batch_objects = pickled_objects(root.group("batch").attr_string("structure"));
  return s;
}

}  // namespace nanscope::format
