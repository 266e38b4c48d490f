#include "nanscope/replay/inspect.hpp"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/istream_adapter.h>

#include <sstream>

#include "nanscope/common/error_text.hpp"
#include "nanscope/common/json_text.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/batch.hpp"

namespace nanscope::replay {

namespace {

// A TorchScript file is a zip archive; its .py records are the program's
// source. Its directory is read, no record: loading (torch::jit::load) would
// run the program's __setstate__ methods, and a record's size is what the
// archive claims, not what the snapshot bounds.
std::vector<std::string> program_files(const std::string& program) {
  std::istringstream bytes(program);
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<caffe2::serialize::IStreamAdapter>(&bytes));
  std::vector<std::string> files;
  for (const std::string& record : reader.getAllRecords())
    if (record.size() >= 3 && record.compare(record.size() - 3, 3, ".py") == 0) files.push_back(record);
  return files;
}

int64_t values(const format::StoredTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string tensors_heading(const std::vector<format::StoredTensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += values(t);
  return std::to_string(tensors.size()) + " tensor(s), " + std::to_string(total) + " values";
}

void list_tensors(std::ostringstream& o, const std::vector<format::StoredTensor>& tensors) {
  for (const auto& t : tensors)
    o << "    " << t.name << "  " << format::dtype_name(t.dtype) << " " << shape_text(t.shape) << "\n";
}

std::string tensors_json(const std::vector<format::StoredTensor>& tensors) {
  return list_json(tensors, [](const format::StoredTensor& t) {
    return "{ \"name\": " + json_quoted(t.name) + ", \"dtype\": " + json_quoted(format::dtype_name(t.dtype)) +
           ", \"shape\": " + shape_text(t.shape) + " }";
  });
}

}  // namespace

SnapshotInspection inspect_snapshot(const std::string& path) {
  SnapshotInspection out;
  out.inventory = format::read_snapshot_inventory(path);
  if (!out.inventory.batch_structure.empty()) {
    // A nested batch's tensors by their place in it ("['input_ids']", "[1][3].boxes"), as births name them.
    int64_t leaves = 0;
    for (const auto& t : out.inventory.batch) leaves += t.name.rfind("leaf ", 0) == 0;
    const std::vector<std::string> names =
        Batch::nested(std::vector<at::Tensor>(size_t(leaves)), out.inventory.batch_structure).leaf_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (!names[i].empty()) out.inventory.batch[i].name = names[i];
  }
  if (out.inventory.summary.program_bytes > 0) {
    format::Archive archive = format::Archive::open(path, format::kSnapshotFileKind);
    const std::string program = archive.root().group("model").blob("torchscript");
    try {
      out.program_files = program_files(program);
    } catch (const std::exception& e) {
      out.program_error = one_line_error(e);
    }
  }
  return out;
}

std::string to_text(const SnapshotInspection& in) {
  const format::SnapshotInventory& inv = in.inventory;
  const format::SnapshotSummary& s = inv.summary;
  std::ostringstream o;
  o << "snapshot " << s.path << ": step " << s.step << ", written by " << format::to_string(s.origin) << "\n"
    << format::replay_runs_text(s) << "\n"
    << "  model:      " << s.model_name;
  if (!inv.model_hparams.empty()) {
    o << " (";
    const char* sep = "";
    for (const auto& [key, value] : inv.model_hparams) o << sep << key << "=" << value, sep = ", ";
    o << ")";
  }
  o << "\n";
  if (s.program_bytes > 0) {
    o << "  program:    " << s.program_bytes << " bytes of TorchScript";
    if (!in.program_error.empty())
      o << "; its files could not be listed: " << in.program_error << "\n";
    else
      o << ", " << in.program_files.size() << " source file(s):\n";
    for (const std::string& file : in.program_files) o << "    " << file << "\n";
  }
  o << "  parameters: " << tensors_heading(inv.parameters) << "\n";
  list_tensors(o, inv.parameters);
  o << "  buffers:    " << tensors_heading(inv.buffers) << "\n";
  list_tensors(o, inv.buffers);
  o << "  optimizer:  " << (inv.optimizer.empty() ? "none" : inv.optimizer) << ", state "
    << tensors_heading(inv.optimizer_state) << "\n"
    << "  batch:      " << tensors_heading(inv.batch);
  if (s.pickled_batch_objects > 0) o << ", and " << s.pickled_batch_objects << " pickled Python object(s)";
  o << "\n";
  list_tensors(o, inv.batch);
  return o.str();
}

std::string to_json(const SnapshotInspection& in) {
  const format::SnapshotInventory& inv = in.inventory;
  const format::SnapshotSummary& s = inv.summary;
  std::string hparams = "{";
  for (const auto& [key, value] : inv.model_hparams)
    hparams += (hparams.size() > 1 ? ", " : " ") + json_quoted(key) + ": " + json_quoted(value);
  hparams += hparams.size() > 1 ? " }" : "}";
  const std::string files = list_json(in.program_files, [](const std::string& file) { return json_quoted(file); });
  std::ostringstream o;
  o << "{ \"snapshot\": " << json_quoted(s.path) << ", \"step\": " << s.step
    << ", \"origin\": " << json_quoted(format::to_string(s.origin)) << ",\n"
    << "  \"carries_code\": " << (format::carries_code(s) ? "true" : "false")
    << ", \"replay_runs\": " << json_quoted(format::replay_runs_text(s)) << ",\n"
    << "  \"model\": { \"name\": " << json_quoted(s.model_name) << ", \"hparams\": " << hparams
    << ", \"program_bytes\": " << s.program_bytes << ", \"program_files\": " << files
    << ", \"program_error\": " << (in.program_error.empty() ? "null" : json_quoted(in.program_error)) << " },\n"
    << "  \"parameters\": " << tensors_json(inv.parameters) << ",\n"
    << "  \"buffers\": " << tensors_json(inv.buffers) << ",\n"
    << "  \"optimizer\": { \"name\": " << json_quoted(inv.optimizer)
    << ", \"state\": " << tensors_json(inv.optimizer_state) << " },\n"
    << "  \"batch\": { \"tensors\": " << tensors_json(inv.batch) << ", \"pickled_objects\": " << s.pickled_batch_objects
    << " } }\n";
  return o.str();
}

}  // namespace nanscope::replay
