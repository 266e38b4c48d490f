#include "nanscope/format/precision_trail.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "nanscope/format/error.hpp"

namespace nanscope::format {

namespace {

// Three significant digits: what a person compares errors by.
std::string short_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

// A text column: one line per row (a module path, an op, a node's name never
// holds a newline), rows may be empty (the root module).
std::string joined(const std::vector<OpError>& ops, std::string (*field)(const OpError&)) {
  std::string text;
  for (size_t i = 0; i < ops.size(); ++i) text += (i ? "\n" : "") + field(ops[i]);
  return text;
}

std::vector<std::string> rows_of(const std::string& text, size_t n) {
  std::vector<std::string> rows;
  if (n == 0) return rows;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    rows.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return rows;
}

std::vector<double> double_values(const TensorData& t, const std::string& path, const std::string& what) {
  if (t.dtype != DType::float64 || t.shape.size() != 1)
    throw FormatError(path, what + " is not a column of float64 values");
  std::vector<double> out(size_t(t.numel()));
  std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(double));
  return out;
}

}  // namespace

int64_t first_precision_loss(const std::vector<OpError>& ops, double margin_ulps) {
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].nonfinite > 0 || !(ops[i].ulps <= margin_ulps)) return int64_t(i);
  return -1;
}

std::string op_error_text(const OpError& e) {
  std::string where = e.op.module.empty() ? "(root)" : e.op.module;
  if (!e.op.backward_node.empty()) where += " " + e.op.backward_node;
  std::string text = e.op.op + "  " + where + "  " + to_string(e.op.phase) + "  " + short_number(e.ulps) + " ulps";
  if (e.nonfinite == 0 || e.max_abs > 0)  // an op whose every value went non-finite has no finite difference
    text += "  max abs " + short_number(e.max_abs) + "  max rel " + short_number(e.max_rel);
  if (e.nonfinite > 0) text += "  " + std::to_string(e.nonfinite) + " non-finite where fp32 is finite";
  return text;
}

std::string precision_lost_text(const PrecisionTrail& trail) {
  const std::string margin = short_number(trail.margin_ulps) + " ulps of " + trail.type;
  if (trail.first_lost < 0 || size_t(trail.first_lost) >= trail.ops.size())
    return "no op of the " + std::to_string(trail.ops.size()) + " compared leaves fp32 by more than" + " " + margin +
           (trail.cut_short.empty() ? "" : " (" + trail.cut_short + ")");
  const OpError& e = trail.ops[size_t(trail.first_lost)];
  std::string text = e.op.op + " in module '" + e.op.module + "' (" + to_string(e.op.phase) +
                     (e.op.backward_node.empty() ? "" : ", " + e.op.backward_node) + "): ";
  text += e.nonfinite > 0 ? std::to_string(e.nonfinite) + " value(s) non-finite where fp32's are finite"
                          : short_number(e.ulps) + " ulps of " + trail.type + " from fp32";
  if (e.nonfinite == 0 || e.max_abs > 0)
    text += " (max abs " + short_number(e.max_abs) + ", max rel " + short_number(e.max_rel) + ")";
  if (trail.first_lost > 0)
    text += "; the " + std::to_string(trail.first_lost) + " ops before it stay within " + margin;
  return text;
}

std::vector<size_t> trail_rows_to_show(const PrecisionTrail& trail, size_t before, size_t rows) {
  std::vector<size_t> shown;
  if (trail.ops.empty() || rows == 0) return shown;
  const size_t last = trail.ops.size() - 1;
  const size_t lost = trail.first_lost >= 0 ? size_t(trail.first_lost) : last;
  for (size_t i = lost > before ? lost - before : 0; i < last && shown.size() + 1 < rows; ++i) shown.push_back(i);
  shown.push_back(last);
  return shown;
}

void write_precision_trail(const Group& g, const PrecisionTrail& t) {
  g.set_attr("type", t.type);
  g.set_attr("margin_ulps", t.margin_ulps);
  g.set_attr("first_lost", t.first_lost);
  g.set_attr("unmatched", t.unmatched);
  g.set_attr("cut_short", t.cut_short);
  const int64_t n = int64_t(t.ops.size());
  g.set_attr("count", n);
  if (n == 0) return;
  std::vector<int64_t> index, nonfinite;
  std::vector<double> max_abs, max_rel, ulps;
  for (const OpError& e : t.ops) {
    index.push_back(e.op.index);
    nonfinite.push_back(e.nonfinite);
    max_abs.push_back(e.max_abs);
    max_rel.push_back(e.max_rel);
    ulps.push_back(e.ulps);
  }
  g.put_tensor("index", DType::int64, {n}, index.data());
  g.put_tensor("nonfinite", DType::int64, {n}, nonfinite.data());
  g.put_tensor("max_abs", DType::float64, {n}, max_abs.data());
  g.put_tensor("max_rel", DType::float64, {n}, max_rel.data());
  g.put_tensor("ulps", DType::float64, {n}, ulps.data());
  auto put_text = [&](const char* name, std::string (*field)(const OpError&)) {
    const std::string text = joined(t.ops, field);
    g.put_blob(name, text.data(), text.size());
  };
  put_text("op", [](const OpError& e) { return e.op.op; });
  put_text("phase", [](const OpError& e) { return std::string(to_string(e.op.phase)); });
  put_text("module", [](const OpError& e) { return e.op.module; });
  put_text("backward_node", [](const OpError& e) { return e.op.backward_node; });
}

PrecisionTrail read_precision_trail(const Group& g) {
  PrecisionTrail t;
  t.type = g.attr_string("type");
  t.margin_ulps = g.attr_double("margin_ulps");
  t.first_lost = g.attr_int("first_lost");
  t.unmatched = g.attr_int("unmatched");
  t.cut_short = g.attr_string("cut_short");
  const int64_t n = g.attr_int("count");
  if (n < 0 || t.first_lost < -1 || t.first_lost >= n)
    throw FormatError(g.file_path(), g.name() + ": count " + std::to_string(n) + " and first_lost " +
                                         std::to_string(t.first_lost) + " do not fit together");
  if (n == 0) return t;
  const std::string& file = g.file_path();
  auto column = [&](const char* name) {
    const TensorData shape = g.tensor_shape(name);
    if (shape.shape.size() != 1 || shape.shape[0] != n)
      throw FormatError(file, g.name() + "/" + name + " does not hold one value per op (" + std::to_string(n) + ")");
    return g.tensor(name);
  };
  const std::vector<int64_t> index = int_values(column("index"), file, g.name() + "/index");
  const std::vector<int64_t> nonfinite = int_values(column("nonfinite"), file, g.name() + "/nonfinite");
  const std::vector<double> max_abs = double_values(column("max_abs"), file, g.name() + "/max_abs");
  const std::vector<double> max_rel = double_values(column("max_rel"), file, g.name() + "/max_rel");
  const std::vector<double> ulps = double_values(column("ulps"), file, g.name() + "/ulps");
  auto text_column = [&](const char* name) {
    std::vector<std::string> rows = rows_of(g.blob(name), size_t(n));
    if (rows.size() != size_t(n))
      throw FormatError(file, g.name() + "/" + name + " does not hold one line per op (" + std::to_string(n) + ")");
    return rows;
  };
  const std::vector<std::string> op = text_column("op"), phase = text_column("phase"), module = text_column("module"),
                                 node = text_column("backward_node");
  for (size_t i = 0; i < size_t(n); ++i) {
    OpError e;
    e.op.index = index[i];
    e.op.op = op[i];
    e.op.phase = from_string_or_unknown<Phase>(phase[i]);
    e.op.module = module[i];
    e.op.backward_node = node[i];
    e.max_abs = max_abs[i];
    e.max_rel = max_rel[i];
    e.ulps = ulps[i];
    e.nonfinite = nonfinite[i];
    t.ops.push_back(std::move(e));
  }
  return t;
}

}  // namespace nanscope::format
