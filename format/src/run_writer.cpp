#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <vector>

#include "h5.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_file.hpp"
#include "nanscope/format/version.hpp"
#include "overview_columns.hpp"
#include "rehearsal.hpp"
#include "run_columns.hpp"
#include "run_schema.hpp"

namespace nanscope::format {

namespace {

// How many leading entries of an ascending int64 column are <= `step`.
hsize_t rows_through(const Column& column, int64_t step, const std::string& path) {
  std::vector<int64_t> steps(row_count(column, path));
  if (!steps.empty())
    h5::check(H5Dread(column.dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), path,
              "cannot read steps");
  return hsize_t(std::upper_bound(steps.begin(), steps.end(), step) - steps.begin());
}

// HDF5's own switch for `h5clear -s`: open a file whose superblock says a
// writer still has it, and clear that on close.
h5::Handle open_clearing_writer_mark(const std::string& path) {
  h5::Handle fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate");
  h5::check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), path, "H5Pset_libver_bounds");
  hbool_t clear = 1;
  h5::check(H5Pset(fapl.get(), "clear_status_flags", &clear), path, "cannot ask to clear the writer's mark");
  return h5::file_handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl.get()), path,
                         "cannot open the run file for writing (read-only, in use by a live writer, or corrupt?)");
}

// Which process writes the file (1.8): a reader that finds the file marked
// open for writing after that process is gone clears the mark
// (clear_mark_if_writer_gone). Before SWMR writing starts, as every attribute.
void write_writer_identity(hid_t file, const std::string& path) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  h5::write_int_attr(file, "writer_pid", int64_t(getpid()), path);
  h5::write_string_attr(file, "writer_host", host, path);
}

// Copies a string into a fixed-size, null-padded field (truncating).
void put_fixed(std::vector<char>& out, const std::string& value, size_t width) {
  size_t start = out.size();
  out.resize(start + width, '\0');
  std::copy_n(value.data(), std::min(value.size(), width), out.data() + start);
}

}  // namespace

struct RunWriter::Impl {
  std::string path;
  size_t flush_every;
  size_t layers;
  bool act_absmax;
  h5::Handle file;
  h5::Handle kind_type, text_type;
  Column step, loss, lr, loss_scale, grad_norm, skipped, amp, step_time, layer_grad_norm, layer_act_absmax;
  Column event_step, event_kind, event_text;
  std::vector<StepRow> pending;
  std::vector<RunEvent> pending_events;
  std::chrono::steady_clock::time_point oldest_pending;  // when the oldest unwritten row came
  // The overview (run_overview.hpp): absent when resuming a file written
  // before it existed (no new dataset can be added to an existing file's
  // SWMR layout; its readers build one from the rows).
  std::optional<OverviewColumns> overview;
  std::optional<OverviewBuilder> overview_builder;

  void write_pending();
};

RunWriter::RunWriter(const std::string& path, const RunHeader& header, size_t flush_every)
    : impl_(std::make_unique<Impl>()) {
  h5::silence_errors();
  Impl& m = *impl_;
  m.path = path;
  m.flush_every = std::max<size_t>(1, flush_every);
  m.layers = header.layer_names.size();
  m.act_absmax = header.record_act_absmax && m.layers > 0;

  // SWMR needs the latest file-format features.
  h5::Handle fapl = h5::plist_handle(H5Pcreate(H5P_FILE_ACCESS), path, "H5Pcreate");
  h5::check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), path, "H5Pset_libver_bounds");
  m.file = h5::file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), path,
                           "cannot create run file (directory missing or not writable?)");
  hid_t file = m.file.get();
  h5::write_identity(file, kRunFileKind, path);
  h5::write_string_attr(file, "origin", to_string(header.origin), path);
  write_writer_identity(file, path);

  // Everything is created before SWMR writing starts: HDF5 1.10 allows no new
  // objects or attributes afterwards, only appends to existing datasets.
  {
    h5::Handle config = h5::group_handle(
        H5Gcreate2(file, run_schema::kConfigGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, "create /config");
    for (const auto& [key, value] : header.config) h5::write_string_attr(config.get(), key, value, path);
  }
  {
    h5::Handle layers = h5::group_handle(
        H5Gcreate2(file, run_schema::kLayersGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, "create /layers");
    size_t width = 1;
    for (const auto& name : header.layer_names) width = std::max(width, name.size());
    h5::Handle type = h5::fixed_string_type(width, path);
    hsize_t n = header.layer_names.size();
    h5::Handle space = h5::space_handle(H5Screate_simple(1, &n, nullptr), path, "H5Screate");
    h5::Handle names = h5::dataset_handle(
        H5Dcreate2(layers.get(), "names", type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
        "create /layers/names");
    std::vector<char> packed;
    for (const auto& name : header.layer_names) put_fixed(packed, name, width);
    if (n > 0)
      h5::check(H5Dwrite(names.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), path,
                "write /layers/names");
  }
  h5::Handle steps = h5::group_handle(H5Gcreate2(file, run_schema::kStepsGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                      path, "create /steps");
  hid_t g = steps.get();
  m.step = create_column(g, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, path);
  m.loss = create_column(g, "loss", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, path);
  m.lr = create_column(g, "lr", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, path);
  m.loss_scale = create_column(g, "loss_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, path);
  m.grad_norm = create_column(g, "grad_norm", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, path);
  m.skipped = create_column(g, "skipped", H5T_STD_U8LE, H5T_NATIVE_UINT8, 0, path);
  m.amp = create_column(g, "amp", H5T_STD_U8LE, H5T_NATIVE_UINT8, 0, path);
  m.step_time = create_column(g, "step_time", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, path);
  if (m.layers > 0)
    m.layer_grad_norm = create_column(g, "layer_grad_norm", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, m.layers, path);
  if (m.act_absmax)
    m.layer_act_absmax = create_column(g, "layer_act_absmax", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, m.layers, path);

  m.overview = OverviewColumns::create(file, m.layers, m.act_absmax, path);
  m.overview_builder.emplace(m.layers, m.act_absmax);

  h5::Handle events = h5::group_handle(
      H5Gcreate2(file, run_schema::kEventsGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path, "create /events");
  m.kind_type = h5::fixed_string_type(run_schema::kEventKindWidth, path);
  m.text_type = h5::fixed_string_type(run_schema::kEventTextWidth, path);
  m.event_step = create_column(events.get(), "step", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, path);
  m.event_kind = create_column(events.get(), "kind", m.kind_type.get(), m.kind_type.get(), 0, path);
  m.event_text = create_column(events.get(), "text", m.text_type.get(), m.text_type.get(), 0, path);

  h5::check(H5Fstart_swmr_write(file), path, "cannot start SWMR writing");
}

RunWriter::RunWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<RunWriter> RunWriter::resume(const std::string& path, int64_t keep_through_step, size_t flush_every) {
  h5::silence_errors();
  h5::rehearse_in_child(path, [&] { h5::walk_metadata(path); });
  {
    h5::Handle probe = h5::open_file_readonly(path);  // the usual checks and messages: missing, empty, not HDF5
    h5::check_identity(probe.get(), kRunFileKind, path);
  }
  auto m = std::make_unique<Impl>();
  m->path = path;
  m->flush_every = std::max<size_t>(1, flush_every);
  m->file = open_clearing_writer_mark(path);
  // What is appended from here on is this version's schema: the file says so.
  h5::write_string_attr(m->file.get(), "format_version",
                        std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor), path);
  write_writer_identity(m->file.get(), path);
  hid_t file = m->file.get();
  h5::Handle steps = h5::group_handle(H5Gopen2(file, run_schema::kStepsGroup, H5P_DEFAULT), path, "open /steps");
  hid_t g = steps.get();
  m->step = open_column(g, "step", H5T_NATIVE_INT64, path);
  m->loss = open_column(g, "loss", H5T_NATIVE_DOUBLE, path);
  m->lr = open_column(g, "lr", H5T_NATIVE_DOUBLE, path);
  m->loss_scale = open_column(g, "loss_scale", H5T_NATIVE_DOUBLE, path);
  m->grad_norm = open_column(g, "grad_norm", H5T_NATIVE_DOUBLE, path);
  m->skipped = open_column(g, "skipped", H5T_NATIVE_UINT8, path);
  m->amp = open_column(g, "amp", H5T_NATIVE_UINT8, path);
  m->step_time = open_column(g, "step_time", H5T_NATIVE_DOUBLE, path);
  m->layers = 0;
  if (h5::link_exists(g, "layer_grad_norm")) {
    m->layer_grad_norm = open_column(g, "layer_grad_norm", H5T_NATIVE_FLOAT, path);
    m->layers = m->layer_grad_norm.columns;
  }
  m->act_absmax = h5::link_exists(g, "layer_act_absmax");
  if (m->act_absmax) m->layer_act_absmax = open_column(g, "layer_act_absmax", H5T_NATIVE_FLOAT, path);
  h5::Handle events = h5::group_handle(H5Gopen2(file, run_schema::kEventsGroup, H5P_DEFAULT), path, "open /events");
  m->kind_type = h5::fixed_string_type(run_schema::kEventKindWidth, path);
  m->text_type = h5::fixed_string_type(run_schema::kEventTextWidth, path);
  m->event_step = open_column(events.get(), "step", H5T_NATIVE_INT64, path);
  m->event_kind = open_column(events.get(), "kind", m->kind_type.get(), path);
  m->event_text = open_column(events.get(), "text", m->text_type.get(), path);

  // The rows after the checkpoint go (the step column, whose length is the
  // row count, first), then the events after it.
  const hsize_t rows = rows_through(m->step, keep_through_step, path);
  for (Column* c : {&m->step, &m->loss, &m->lr, &m->loss_scale, &m->grad_norm, &m->skipped, &m->amp, &m->step_time,
                    &m->layer_grad_norm, &m->layer_act_absmax})
    truncate(*c, rows, path);
  const hsize_t kept_events = rows_through(m->event_step, keep_through_step, path);
  for (Column* c : {&m->event_step, &m->event_kind, &m->event_text}) truncate(*c, kept_events, path);
  m->overview = OverviewColumns::open(file, path);
  if (m->overview) {
    m->overview_builder.emplace(m->layers, m->act_absmax);
    m->overview->keep_rows(rows, *m->overview_builder, file, path);
  }
  h5::check(H5Fstart_swmr_write(file), path, "cannot start SWMR writing");
  return std::unique_ptr<RunWriter>(new RunWriter(std::move(m)));
}

bool clear_writer_mark(const std::string& path) {
  h5::silence_errors();
  h5::rehearse_in_child(path, [&] { h5::walk_metadata(path); });
  {
    h5::Handle file = h5::open_file_readonly(path);  // the usual checks and messages
  }
  if (hid_t plain = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); plain >= 0) {
    H5Fclose(plain);
    return false;  // closed properly: a plain reader opens it already
  }
  open_clearing_writer_mark(path);  // cleared when the handle closes
  return true;
}

std::string keep_aside(const std::string& path) {
  const std::filesystem::path original(path);
  const std::string stem = (original.parent_path() / original.stem()).string();
  for (int n = 1;; ++n) {
    const std::string aside = stem + "." + std::to_string(n) + original.extension().string();
    std::error_code taken;
    if (std::filesystem::exists(aside, taken)) continue;
    std::filesystem::rename(original, aside, taken);
    if (taken) throw WriteError(path, "cannot keep the earlier run's file as " + aside + ": " + taken.message());
    return aside;
  }
}

RunWriter::~RunWriter() {
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; the last batch is lost and that is all.
  }
}

const std::string& RunWriter::path() const { return impl_->path; }

void RunWriter::append(const StepRow& row) {
  Impl& m = *impl_;
  if (m.layers > 0 && !row.layer_grad_norm.empty() && row.layer_grad_norm.size() != m.layers)
    throw FormatError(m.path, "row has " + std::to_string(row.layer_grad_norm.size()) + " layer norms, the file has " +
                                  std::to_string(m.layers) + " layers");
  const auto now = std::chrono::steady_clock::now();
  if (m.pending.empty()) m.oldest_pending = now;
  m.pending.push_back(row);
  // Slow steps are written within seconds, so a SIGKILL loses little of a long run.
  if (m.pending.size() >= m.flush_every || now - m.oldest_pending >= kMaxRowAge) flush();
}

void RunWriter::event(const RunEvent& event) {
  impl_->pending_events.push_back(event);
  // Events are rare and matter after a crash: write them with the next batch,
  // but never let them wait longer than the rows around them.
  if (impl_->pending_events.size() >= impl_->flush_every) flush();
}

void RunWriter::flush() {
  impl_->write_pending();
  if (H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL) < 0)
    throw WriteError(impl_->path, "cannot flush run file (disk full?)");
}

void RunWriter::Impl::write_pending() {
  const hsize_t n = pending.size();
  if (n > 0) {
    std::vector<int64_t> steps(n);
    std::vector<double> losses(n), lrs(n), scales(n), norms(n), times(n);
    std::vector<uint8_t> skips(n), amps(n);
    std::vector<float> layer_norms(layers > 0 ? n * layers : 0, std::nanf(""));
    std::vector<float> act(act_absmax ? n * layers : 0, std::nanf(""));
    for (hsize_t i = 0; i < n; ++i) {
      const StepRow& r = pending[i];
      steps[i] = r.step;
      losses[i] = r.loss;
      lrs[i] = r.lr;
      scales[i] = r.loss_scale;
      norms[i] = r.grad_norm;
      times[i] = r.step_time;
      skips[i] = r.skipped ? 1 : 0;
      amps[i] = static_cast<uint8_t>(r.amp);
      // A row without layer values (e.g. a skipped step) keeps NaN placeholders.
      if (layers > 0 && r.layer_grad_norm.size() == layers)
        std::copy(r.layer_grad_norm.begin(), r.layer_grad_norm.end(), &layer_norms[i * layers]);
      if (act_absmax && r.layer_act_absmax.size() == layers)
        std::copy(r.layer_act_absmax.begin(), r.layer_act_absmax.end(), &act[i * layers]);
    }
    // The step column goes last; a reader counts a row once every column
    // shows it (a SWMR reader may see the datasets' extents in another order).
    append_rows(loss, losses.data(), n, path);
    append_rows(lr, lrs.data(), n, path);
    append_rows(loss_scale, scales.data(), n, path);
    append_rows(grad_norm, norms.data(), n, path);
    append_rows(skipped, skips.data(), n, path);
    append_rows(amp, amps.data(), n, path);
    append_rows(step_time, times.data(), n, path);
    if (layers > 0) append_rows(layer_grad_norm, layer_norms.data(), n, path);
    if (act_absmax) append_rows(layer_act_absmax, act.data(), n, path);
    append_rows(step, steps.data(), n, path);
    if (overview) {
      RowsView view;
      view.n = n;
      view.layers = layers;
      view.step = steps.data();
      view.loss = losses.data();
      view.lr = lrs.data();
      view.loss_scale = scales.data();
      view.grad_norm = norms.data();
      view.step_time = times.data();
      view.skipped = skips.data();
      view.layer_grad_norm = layers > 0 ? layer_norms.data() : nullptr;
      view.layer_act_absmax = act_absmax ? act.data() : nullptr;
      overview_builder->add(view);
      overview->append(overview_builder->take_completed(), path);
    }
    pending.clear();
  }
  const hsize_t e = pending_events.size();
  if (e > 0) {
    std::vector<int64_t> steps(e);
    std::vector<char> kinds, texts;
    for (hsize_t i = 0; i < e; ++i) {
      steps[i] = pending_events[i].step;
      put_fixed(kinds, to_string(pending_events[i].kind), run_schema::kEventKindWidth);
      put_fixed(texts, pending_events[i].text, run_schema::kEventTextWidth);
    }
    append_rows(event_kind, kinds.data(), e, path);
    append_rows(event_text, texts.data(), e, path);
    append_rows(event_step, steps.data(), e, path);
    pending_events.clear();
  }
}

}  // namespace nanscope::format
