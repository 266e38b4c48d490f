#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "nanscope/format/capture.hpp"
#include "nanscope/format/error.hpp"

namespace nanscope::format {

namespace {

// A list of names as one attribute, a line each (no name holds a newline).
std::string joined_lines(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? "\n" : "") + names[i];
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) names.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return names;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s;
}

// "16,64" -> {16, 64}; nullopt for anything else (a file from outside may hold anything).
std::optional<std::vector<int64_t>> parse_shape(const std::string& s) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    const std::string part = s.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || end != part.c_str() + part.size() || errno == ERANGE || v < 0) return std::nullopt;
    shape.push_back(v);
    start = comma + 1;
  }
  return shape;
}

void write_stats(const Group& g, const std::string& prefix, const TensorStats& t) {
  g.set_attr(prefix + "dtype", t.dtype);
  g.set_attr(prefix + "shape", shape_text(t.shape));
  g.set_attr(prefix + "min", t.min);
  g.set_attr(prefix + "max", t.max);
  g.set_attr(prefix + "absmax", t.absmax);
  g.set_attr(prefix + "nan_count", t.nan_count);
  g.set_attr(prefix + "inf_count", t.inf_count);
}

TensorStats read_stats(const Group& g, const std::string& prefix) {
  TensorStats t;
  t.dtype = g.attr_string(prefix + "dtype");
  const std::string shape = g.attr_string(prefix + "shape");
  const std::optional<std::vector<int64_t>> parsed = parse_shape(shape);
  if (!parsed) throw FormatError(g.file_path(), g.name() + "@" + prefix + "shape '" + shape + "' is no shape");
  t.shape = *parsed;
  t.min = g.attr_double(prefix + "min");
  t.max = g.attr_double(prefix + "max");
  t.absmax = g.attr_double(prefix + "absmax");
  t.nan_count = g.attr_int(prefix + "nan_count");
  t.inf_count = g.attr_int(prefix + "inf_count");
  return t;
}

void write_op(const Group& g, const OpRecord& op) {
  g.set_attr("index", op.index);
  g.set_attr("op", op.op);
  g.set_word("phase", op.phase);
  g.set_attr("module", op.module);
  g.set_attr("backward_node", op.backward_node);
  g.set_attr("forward_op", op.forward_op);
  g.set_attr("seq_nr", op.seq_nr);
  if (op.site != OpSite::op) g.set_word("site", op.site);
  write_stats(g, "output_", op.output);
}

OpRecord read_op(const Group& g) {
  OpRecord op;
  op.index = g.attr_int("index");
  op.op = g.attr_string("op");
  op.phase = g.word<Phase>("phase");
  op.module = g.attr_string("module");
  op.backward_node = g.attr_string("backward_node");
  op.forward_op = g.attr_string("forward_op");
  op.seq_nr = g.attr_int("seq_nr");
  if (g.has_attr("site")) op.site = g.word<OpSite>("site");  // absent: the op itself (and files before 1.6)
  op.output = read_stats(g, "output_");
  return op;
}

void write_birth(const Group& parent, const std::string& name, const std::optional<Birth>& birth) {
  if (!birth) return;
  Group g = parent.group(name);
  write_op(g, birth->op);
  g.set_word("kind", birth->kind);
  g.set_attr("sample", birth->sample);
  if (!birth->input.empty()) g.set_attr("input", birth->input);
  if (birth->micro_batch >= 0) g.set_attr("micro_batch", birth->micro_batch);
  g.set_attr("counted_targets", birth->counted_targets);
  if (!birth->rows.empty()) g.put_tensor("rows", DType::int64, {int64_t(birth->rows.size())}, birth->rows.data());
  g.set_attr("input_count", int64_t(birth->inputs.size()));
  for (size_t i = 0; i < birth->inputs.size(); ++i) write_stats(g, "input" + std::to_string(i) + "_", birth->inputs[i]);
}

std::optional<Birth> read_birth(const Group& parent, const std::string& name) {
  if (!parent.has(name)) return std::nullopt;
  Group g = parent.group(name);
  Birth b;
  b.op = read_op(g);
  b.kind = g.word<BirthKind>("kind");
  b.sample = g.attr_int("sample");
  if (g.has_attr("input")) b.input = g.attr_string("input");  // from 1.8
  if (g.has_attr("micro_batch")) b.micro_batch = g.attr_int("micro_batch");
  if (g.has_attr("counted_targets")) b.counted_targets = g.attr_int("counted_targets");
  if (g.has("rows")) b.rows = int_values(g.tensor("rows"), g.file_path(), g.name() + "/rows");
  const int64_t n = g.attr_int("input_count");
  for (int64_t i = 0; i < n; ++i) b.inputs.push_back(read_stats(g, "input" + std::to_string(i) + "_"));
  return b;
}

}  // namespace

void write_capture(const Group& g, const Capture& c) {
  g.set_attr("reproduced", int64_t(c.reproduced));
  g.set_attr("ops_seen", c.ops_seen);
  if (c.compiled_only) g.set_attr("compiled_only", int64_t(1));
  if (c.compiled_region) g.set_attr("compiled_region", *c.compiled_region);
  if (!c.nonfinite_weights.empty()) g.set_attr("nonfinite_weights", joined_lines(c.nonfinite_weights));
  if (!c.discarded.empty()) g.set_attr("discarded", joined_lines(c.discarded));
  if (c.batch_not_read) g.set_attr("batch_not_read", int64_t(1));
  write_birth(g, "first_birth", c.first_birth);
  write_birth(g, "first_nan_birth", c.first_nan_birth);
  write_birth(g, "first_inf_birth", c.first_inf_birth);
  Group trail = g.group("trail");
  trail.set_attr("count", int64_t(c.trail.size()));
  for (size_t i = 0; i < c.trail.size(); ++i) {
    char name[24];
    std::snprintf(name, sizeof name, "%05zu", i);
    write_op(trail.group(name), c.trail[i]);
  }
}

Capture read_capture(const Group& g) {
  Capture c;
  c.reproduced = g.attr_int("reproduced") != 0;
  c.ops_seen = g.attr_int("ops_seen");
  c.compiled_only = g.has_attr("compiled_only") && g.attr_int("compiled_only") != 0;
  if (g.has_attr("compiled_region")) c.compiled_region = g.attr_string("compiled_region");
  if (g.has_attr("nonfinite_weights"))
    c.nonfinite_weights = split_lines(g.attr_string("nonfinite_weights"));               // from 1.9
  if (g.has_attr("discarded")) c.discarded = split_lines(g.attr_string("discarded"));    // from 1.10
  c.batch_not_read = g.has_attr("batch_not_read") && g.attr_int("batch_not_read") != 0;  // from 1.10
  c.first_birth = read_birth(g, "first_birth");
  c.first_nan_birth = read_birth(g, "first_nan_birth");
  c.first_inf_birth = read_birth(g, "first_inf_birth");
  Group trail = g.group("trail");
  const int64_t n = trail.attr_int("count");
  for (int64_t i = 0; i < n; ++i) {
    char name[24];
    std::snprintf(name, sizeof name, "%05lld", static_cast<long long>(i));
    c.trail.push_back(read_op(trail.group(name)));
  }
  return c;
}

}  // namespace nanscope::format
