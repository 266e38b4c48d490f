#include "nanscope/format/overview_follower.hpp"

#include <algorithm>

#include "h5.hpp"
#include "nanscope/format/error.hpp"
#include "overview_columns.hpp"
#include "rehearsal.hpp"
#include "run_columns.hpp"
#include "run_schema.hpp"

namespace nanscope::format {

namespace {
// The rows read at a time, building an older file's overview or catching up
// with a run: a million-step run of 256 layers is never in memory at once.
constexpr hsize_t kRowsPerRead = 16384;
}  // namespace

struct OverviewFollower::Impl {
  std::string path;
  h5::Handle file;
  size_t layers = 0;  // the layers /steps records (0: no per-layer tables)
  bool grad = false, act = false;
  hsize_t rows = 0;  // rows folded in
  std::optional<OverviewBuilder> builder;
  RunOverview overview;

  // Opens the file and reads its overview.
  void open(const std::function<void(int64_t, int64_t)>& progress);

  // Rows [rows, to) into the builder, a slice at a time.
  void add_rows(hsize_t to, const std::function<void(int64_t, int64_t)>& progress) {
    for (; rows < to;) {
      const hsize_t end = std::min(to, rows + kRowsPerRead);
      const RunData slice = read_step_rows(file.get(), rows, end, layers, grad, act, path);
      builder->add(rows_view(slice, 0, slice.rows()));
      rows = end;
      if (progress) progress(int64_t(rows), int64_t(to));
    }
    builder->publish_into(overview.levels);
    overview.rows = int64_t(rows);
  }
};

void OverviewFollower::Impl::open(const std::function<void(int64_t, int64_t)>& progress) {
  file = h5::open_file_readonly(path);
  const hid_t f = file.get();
  h5::check_identity(f, kRunFileKind, path);
  const std::string names = std::string(run_schema::kLayersGroup) + "/names";
  if (!h5::link_exists(f, names)) throw FormatError(path, names + " missing");
  if (!h5::link_exists(f, run_schema::kStepsGroup)) throw FormatError(path, "/steps missing");
  h5::Handle names_ds = open_dataset(f, run_schema::kLayersGroup, "names", path);
  const std::vector<hsize_t> name_dims = refreshed_dims(names_ds.get(), path, names);
  layers = name_dims.size() == 1 ? size_t(name_dims[0]) : 0;
  const std::string steps = run_schema::kStepsGroup;
  grad = layers > 0 && h5::link_exists(f, steps + "/layer_grad_norm");
  act = layers > 0 && h5::link_exists(f, steps + "/layer_act_absmax");
  const hsize_t committed = committed_rows(f, grad, act, path);
  std::optional<StoredOverview> stored = stored_overview(f, committed, path);
  if (stored && ((stored->layers > 0) != grad || stored->act_absmax != act || (grad && stored->layers != layers)))
    throw FormatError(path, "/overview's layers do not match /steps' (corrupt file?)");
  const size_t table_layers = grad ? layers : 0;
  builder.emplace(table_layers, act);
  if (!stored) {
    // Written before the run kept an overview: made here from the rows.
    overview.built_from_rows = true;
    for (size_t k = 0; k < kOverviewBlockRows.size(); ++k)
      overview.levels.push_back(empty_overview_level(k, table_layers, act));
    add_rows(committed, progress);
    return;
  }
  // Room for the run to double while followed: the blocks appended then
  // never move the arrays (at a million steps x 256 layers, moving the finest
  // level's copied 160 MB at the first poll). Room never written costs no memory.
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k)
    overview.levels.push_back(
        read_overview_blocks(f, *stored, k, 0, stored->blocks[k], path, 2 * stored->blocks[k] + 64));
  seed_open_blocks(*builder, f, *stored, committed, path);
  rows = committed;
  builder->publish_into(overview.levels);
  overview.rows = int64_t(rows);
}

OverviewFollower::OverviewFollower(const std::string& path, const std::function<void(int64_t, int64_t)>& progress)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  read_under_one_rehearsal(path, [&] { impl_->open(progress); });
}

OverviewFollower::~OverviewFollower() = default;

size_t OverviewFollower::refresh() {
  Impl& m = *impl_;
  const hsize_t before = m.rows;
  const hsize_t rows = committed_rows(m.file.get(), m.grad, m.act, m.path);
  if (rows > before) m.add_rows(rows, nullptr);
  return size_t(m.rows - before);
}

const RunOverview& OverviewFollower::overview() const { return impl_->overview; }

RunOverview OverviewFollower::take() && { return std::move(impl_->overview); }

RunOverview read_run_overview(const std::string& path, const std::function<void(int64_t, int64_t)>& progress) {
  return OverviewFollower(path, progress).take();
}

}  // namespace nanscope::format
