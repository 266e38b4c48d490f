#include <algorithm>
#include <cstring>
#include <limits>

#include "h5.hpp"
#include "nanscope/format/bulk_buffer.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/version.hpp"
#include "rehearsal.hpp"
#include "run_columns.hpp"
#include "run_schema.hpp"

namespace nanscope::format {

namespace {

// Reads a 1-D fixed-length string dataset's first `rows` entries.
std::vector<std::string> read_strings(hid_t loc, const std::string& full, hsize_t rows, const std::string& path) {
  h5::Handle ds = h5::dataset_handle(H5Dopen2(loc, full.c_str(), H5P_DEFAULT), path, "cannot open " + full);
  auto dims = refreshed_dims(ds.get(), path, full);
  if (dims.size() != 1 || dims[0] < rows) throw FormatError(path, full + " has an unexpected shape");
  h5::Handle type = h5::type_handle(H5Dget_type(ds.get()), path, "H5Dget_type");
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0)
    throw FormatError(path, full + " is not a fixed-length string dataset");
  size_t width = H5Tget_size(type.get());
  std::vector<char> packed(h5::checked_bytes(ds.get(), {rows}, width, path, full) + 1, '\0');
  std::vector<std::string> out;
  if (rows == 0) return out;
  h5::Handle file_space = h5::space_handle(H5Dget_space(ds.get()), path, "H5Dget_space");
  hsize_t start = 0, count = rows;
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr), path,
            "H5Sselect_hyperslab");
  h5::Handle mem_space = h5::space_handle(H5Screate_simple(1, &count, nullptr), path, "H5Screate");
  h5::check(H5Dread(ds.get(), type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, packed.data()), path,
            "cannot read " + full);
  for (hsize_t i = 0; i < rows; ++i) {
    const char* s = packed.data() + i * width;
    out.emplace_back(s, strnlen(s, width));
  }
  return out;
}

hsize_t row_count(hid_t file, const std::string& full, const std::string& path) {
  h5::Handle ds = h5::dataset_handle(H5Dopen2(file, full.c_str(), H5P_DEFAULT), path, full + " missing");
  auto dims = refreshed_dims(ds.get(), path, full);
  if (dims.size() != 1) throw FormatError(path, full + " is not 1-D");
  return dims[0];
}

}  // namespace

struct RunFollower::Impl {
  h5::Handle file;
  RunData run;
  bool has_layer_grad_norm = false, has_layer_act_absmax = false;

  // Reads steps [from, to) of every column; on failure every column is put
  // back to `from` rows, so a reader never sees columns of different lengths.
  void read_steps(hsize_t from, hsize_t to) {
    try {
      read_step_columns(from, to);
    } catch (...) {
      truncate_rows(from);
      throw;
    }
  }

  void truncate_rows(hsize_t rows) {
    const hsize_t layers = run.layer_names.size();
    for (auto* column : {&run.loss, &run.lr, &run.loss_scale, &run.grad_norm, &run.step_time}) column->resize(rows);
    run.step.resize(rows);
    run.skipped.resize(rows);
    run.amp.resize(rows);
    if (has_layer_grad_norm) run.layer_grad_norm.resize(rows * layers);
    if (has_layer_act_absmax) run.layer_act_absmax.resize(rows * layers);
  }

  void read_step_columns(hsize_t from, hsize_t to) {
    hid_t f = file.get();
    const std::string& path = run.path;
    const std::string steps = run_schema::kStepsGroup;
    const hsize_t layers = run.layer_names.size();
    // The first read leaves room for the run to double: a followed run's
    // next rows then never move its columns (room never written costs no memory).
    const hsize_t room = from == 0 ? 2 * to + 64 : 0;
    read_rows(f, steps, "step", H5T_NATIVE_INT64, from, to, 0, run.step, path, room);
    read_rows(f, steps, "loss", H5T_NATIVE_DOUBLE, from, to, 0, run.loss, path, room);
    read_rows(f, steps, "lr", H5T_NATIVE_DOUBLE, from, to, 0, run.lr, path, room);
    read_rows(f, steps, "loss_scale", H5T_NATIVE_DOUBLE, from, to, 0, run.loss_scale, path, room);
    read_rows(f, steps, "grad_norm", H5T_NATIVE_DOUBLE, from, to, 0, run.grad_norm, path, room);
    read_rows(f, steps, "skipped", H5T_NATIVE_UINT8, from, to, 0, run.skipped, path, room);
    read_rows(f, steps, "amp", H5T_NATIVE_UINT8, from, to, 0, run.amp, path, room);
    read_rows(f, steps, "step_time", H5T_NATIVE_DOUBLE, from, to, 0, run.step_time, path, room);
    if (has_layer_grad_norm)
      read_rows(f, steps, "layer_grad_norm", H5T_NATIVE_FLOAT, from, to, layers, run.layer_grad_norm, path, room);
    if (has_layer_act_absmax)
      read_rows(f, steps, "layer_act_absmax", H5T_NATIVE_FLOAT, from, to, layers, run.layer_act_absmax, path, room);
  }

  // The rows every step column holds. The writer extends /steps/step last,
  // but a SWMR reader may see another dataset's new extent after step's (HDF5
  // orders the metadata of one dataset, not across datasets), so a row
  // counts once all of its columns show it.
  hsize_t committed_rows() {
    hsize_t rows = std::numeric_limits<hsize_t>::max();
    for (const char* name : run_schema::kScalarStepColumns) rows = std::min(rows, leading_dim(name));
    if (has_layer_grad_norm) rows = std::min(rows, leading_dim("layer_grad_norm"));
    if (has_layer_act_absmax) rows = std::min(rows, leading_dim("layer_act_absmax"));
    return rows;
  }

  hsize_t leading_dim(const char* name) {
    h5::Handle ds = open_dataset(file.get(), run_schema::kStepsGroup, name, run.path);
    const auto dims = refreshed_dims(ds.get(), run.path, name);
    return dims.empty() ? 0 : dims[0];
  }

  // Events are few; they are re-read whole when their count changes.
  void read_events() {
    hid_t f = file.get();
    const std::string& path = run.path;
    const std::string events = run_schema::kEventsGroup;
    if (!h5::link_exists(f, events)) throw FormatError(path, events + " missing");
    const hsize_t rows = row_count(f, events + "/step", path);
    if (rows == run.events.size()) return;
    std::vector<int64_t> event_steps;
    read_rows(f, events, "step", H5T_NATIVE_INT64, 0, rows, 0, event_steps, path);
    auto kinds = read_strings(f, events + "/kind", rows, path);
    auto texts = read_strings(f, events + "/text", rows, path);
    run.events.clear();
    for (hsize_t i = 0; i < rows; ++i)
      run.events.push_back({event_steps[i], from_string_or_unknown<EventKind>(kinds[i]), texts[i]});
  }
};

RunFollower::RunFollower(const std::string& path, LayerTables layer_tables) : impl_(std::make_unique<Impl>()) {
  read_under_one_rehearsal(path, [&] { open(path, layer_tables); });
}

void RunFollower::open(const std::string& path, LayerTables layer_tables) {
  impl_->file = h5::open_file_readonly(path);
  hid_t f = impl_->file.get();
  h5::check_identity(f, kRunFileKind, path);

  RunData& run = impl_->run;
  run.path = path;
  run.format_version = h5::read_string_attr(f, "format_version", path);
  if (h5::attr_exists(f, "origin"))
    run.origin = from_string_or_unknown<Origin>(h5::read_string_attr(f, "origin", path));
  if (h5::link_exists(f, run_schema::kConfigGroup)) {
    h5::Handle config =
        h5::group_handle(H5Gopen2(f, run_schema::kConfigGroup, H5P_DEFAULT), path, "cannot open /config");
    for (const auto& key : h5::attr_names(config.get(), path))
      run.config[key] = h5::read_string_attr(config.get(), key, path);
  }
  const std::string names = std::string(run_schema::kLayersGroup) + "/names";
  if (!h5::link_exists(f, run_schema::kLayersGroup) || !h5::link_exists(f, names))
    throw FormatError(path, names + " missing");
  run.layer_names = read_strings(f, names, row_count(f, names, path), path);

  const std::string steps = run_schema::kStepsGroup;
  if (!h5::link_exists(f, steps)) throw FormatError(path, steps + " missing");
  const bool layers = !run.layer_names.empty() && layer_tables == LayerTables::read;
  impl_->has_layer_grad_norm = layers && h5::link_exists(f, steps + "/layer_grad_norm");
  impl_->has_layer_act_absmax = layers && h5::link_exists(f, steps + "/layer_act_absmax");
  refresh();
}

RunFollower::~RunFollower() = default;

size_t RunFollower::refresh() {
  RunData& run = impl_->run;
  const hsize_t rows = impl_->committed_rows();
  const hsize_t have = run.rows();
  if (rows > have) impl_->read_steps(have, rows);
  impl_->read_events();
  return rows > have ? rows - have : 0;
}

const RunData& RunFollower::data() const { return impl_->run; }

RunData RunFollower::take() && { return std::move(impl_->run); }

RunData read_run(const std::string& path, LayerTables layers) { return RunFollower(path, layers).take(); }

}  // namespace nanscope::format
