#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "h5.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/run_overview.hpp"
#include "overview_columns.hpp"
#include "rehearsal.hpp"
#include "run_columns.hpp"
#include "run_schema.hpp"

namespace nanscope::format {

namespace {

constexpr const char* kOverviewGroup = "/overview";
constexpr hsize_t kBlockFields = 4;   // first step, last step, rows, skipped
constexpr hsize_t kScalarFields = 5;  // min, max, last, NaNs, Infs

std::string level_group(size_t level) {
  return std::string(kOverviewGroup) + "/" + std::to_string(kOverviewBlockRows[level]);
}

// A level's blocks [from, to) as the datasets' rows.
struct PackedBlocks {
  std::vector<int64_t> blocks;
  std::vector<double> scalars;
  std::vector<float> grad, act;
  std::vector<uint32_t> grad_counts, act_counts;
};

template <typename T>
void pack_stats(const BlockStats<T>& s, size_t b, std::vector<T>& values, std::vector<uint32_t>& counts) {
  const size_t w = s.width, at = b * w;
  for (const std::vector<T>* v : {&s.min, &s.max, &s.last})
    values.insert(values.end(), v->begin() + at, v->begin() + at + w);
  for (const std::vector<uint32_t>* v : {&s.nan, &s.inf})
    counts.insert(counts.end(), v->begin() + at, v->begin() + at + w);
}

PackedBlocks pack(const OverviewLevel& level) {
  PackedBlocks p;
  for (size_t b = 0; b < level.blocks(); ++b) {
    p.blocks.insert(p.blocks.end(), {level.first_step[b], level.last_step[b], level.rows[b], level.skipped[b]});
    for (size_t s = 0; s < kOverviewScalars; ++s) {
      const size_t at = b * kOverviewScalars + s;
      p.scalars.insert(p.scalars.end(), {level.scalars.min[at], level.scalars.max[at], level.scalars.last[at],
                                         double(level.scalars.nan[at]), double(level.scalars.inf[at])});
    }
    if (level.layer_grad_norm.width > 0) pack_stats(level.layer_grad_norm, b, p.grad, p.grad_counts);
    if (level.layer_act_absmax.width > 0) pack_stats(level.layer_act_absmax, b, p.act, p.act_counts);
  }
  return p;
}

// A stored count must be one a block of `rows` rows can hold.
uint32_t checked_count(double stored, int64_t rows, const std::string& path, const std::string& what) {
  if (!(stored >= 0 && stored <= double(rows)) || stored != std::floor(stored))
    throw FormatError(path, what + " holds a count of " + std::to_string(stored) + " in a block of " +
                                std::to_string(rows) + " rows (corrupt file?)");
  return uint32_t(stored);
}

}  // namespace

OverviewColumns OverviewColumns::create(hid_t file, size_t layers, bool act_absmax, const std::string& path) {
  OverviewColumns out;
  out.layers_ = layers;
  out.act_absmax_ = act_absmax && layers > 0;
  h5::Handle root = h5::group_handle(H5Gcreate2(file, kOverviewGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                                     "create /overview");
  std::string sizes;
  for (int64_t rows : kOverviewBlockRows) sizes += (sizes.empty() ? "" : ",") + std::to_string(rows);
  h5::write_string_attr(root.get(), "block_rows", sizes, path);
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k) {
    h5::Handle g = h5::group_handle(H5Gcreate2(file, level_group(k).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                    path, "create " + level_group(k));
    Level level;
    level.blocks = create_column(g.get(), "blocks", H5T_STD_I64LE, H5T_NATIVE_INT64, kBlockFields, path);
    level.scalars =
        create_column(g.get(), "scalars", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, kOverviewScalars * kScalarFields, path);
    if (layers > 0) {
      level.grad = create_column(g.get(), "layer_grad_norm", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3 * layers, path);
      level.grad_counts =
          create_column(g.get(), "layer_grad_norm_counts", H5T_STD_U32LE, H5T_NATIVE_UINT32, 2 * layers, path);
    }
    if (out.act_absmax_) {
      level.act = create_column(g.get(), "layer_act_absmax", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3 * layers, path);
      level.act_counts =
          create_column(g.get(), "layer_act_absmax_counts", H5T_STD_U32LE, H5T_NATIVE_UINT32, 2 * layers, path);
    }
    out.levels_.push_back(std::move(level));
  }
  return out;
}

std::optional<OverviewColumns> OverviewColumns::open(hid_t file, const std::string& path) {
  if (!h5::link_exists(file, kOverviewGroup)) return std::nullopt;
  OverviewColumns out;
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k) {
    const std::string name = level_group(k);
    if (!h5::link_exists(file, name)) throw FormatError(path, name + " missing");
    h5::Handle g = h5::group_handle(H5Gopen2(file, name.c_str(), H5P_DEFAULT), path, "open " + name);
    Level level;
    level.blocks = open_column(g.get(), "blocks", H5T_NATIVE_INT64, path);
    level.scalars = open_column(g.get(), "scalars", H5T_NATIVE_DOUBLE, path);
    if (h5::link_exists(g.get(), "layer_grad_norm")) {
      level.grad = open_column(g.get(), "layer_grad_norm", H5T_NATIVE_FLOAT, path);
      level.grad_counts = open_column(g.get(), "layer_grad_norm_counts", H5T_NATIVE_UINT32, path);
      out.layers_ = level.grad.columns / 3;
    }
    if (h5::link_exists(g.get(), "layer_act_absmax")) {
      level.act = open_column(g.get(), "layer_act_absmax", H5T_NATIVE_FLOAT, path);
      level.act_counts = open_column(g.get(), "layer_act_absmax_counts", H5T_NATIVE_UINT32, path);
      out.act_absmax_ = true;
    }
    out.levels_.push_back(std::move(level));
  }
  return out;
}

void OverviewColumns::append(const std::vector<OverviewLevel>& completed, const std::string& path) {
  for (size_t k = 0; k < levels_.size() && k < completed.size(); ++k) {
    const hsize_t n = completed[k].blocks();
    if (n == 0) continue;
    const PackedBlocks p = pack(completed[k]);
    Level& level = levels_[k];
    // The block rows go last: a reader counts a block once they show it.
    append_rows(level.scalars, p.scalars.data(), n, path);
    if (layers_ > 0) {
      append_rows(level.grad, p.grad.data(), n, path);
      append_rows(level.grad_counts, p.grad_counts.data(), n, path);
    }
    if (act_absmax_) {
      append_rows(level.act, p.act.data(), n, path);
      append_rows(level.act_counts, p.act_counts.data(), n, path);
    }
    append_rows(level.blocks, p.blocks.data(), n, path);
  }
}

void OverviewColumns::keep_rows(hsize_t rows, OverviewBuilder& builder, hid_t file, const std::string& path) {
  const std::optional<StoredOverview> stored = stored_overview(file, rows, path);
  if (!stored) return;
  for (size_t k = 0; k < levels_.size(); ++k)
    for (Column* c : {&levels_[k].blocks, &levels_[k].scalars, &levels_[k].grad, &levels_[k].grad_counts,
                      &levels_[k].act, &levels_[k].act_counts})
      truncate(*c, stored->blocks[k], path);
  builder.reset();
  seed_open_blocks(builder, file, *stored, rows, path);
}

std::optional<StoredOverview> stored_overview(hid_t file, hsize_t rows, const std::string& path) {
  if (!h5::link_exists(file, kOverviewGroup)) return std::nullopt;
  StoredOverview out;
  hsize_t supported = rows;  // what the level below supports, in this level's units (rows for the finest)
  for (size_t k = 0; k < kOverviewBlockRows.size(); ++k) {
    const std::string group = level_group(k);
    if (!h5::link_exists(file, group)) throw FormatError(path, group + " missing");
    hsize_t blocks = 0;
    for (const char* name : {"blocks", "scalars", "layer_grad_norm", "layer_grad_norm_counts", "layer_act_absmax",
                             "layer_act_absmax_counts"}) {
      if (!h5::link_exists(file, group + "/" + name)) continue;
      h5::Handle ds = open_dataset(file, group, name, path);
      const std::vector<hsize_t> dims = refreshed_dims(ds.get(), path, group + "/" + name);
      if (dims.size() != 2) throw FormatError(path, group + "/" + name + " is not a table of blocks");
      blocks = std::string(name) == "blocks" ? dims[0] : std::min(blocks, dims[0]);
      if (std::string(name) == "layer_grad_norm") out.layers = dims[1] / 3;
      if (std::string(name) == "layer_act_absmax") out.act_absmax = true;
    }
    const hsize_t step = hsize_t(k == 0 ? kOverviewBlockRows[0] : kOverviewBlockRows[k] / kOverviewBlockRows[k - 1]);
    blocks = std::min(blocks, supported / step);
    out.blocks.push_back(blocks);
    supported = blocks;
  }
  return out;
}

namespace {

// Columns [first, first + count) of rows [from, to) of a [rows x columns]
// dataset, straight into `out` ([rows x count]): a field of every layer read
// into its own array, with no copy in between.
void read_columns(hid_t ds, hid_t mem_type, hsize_t from, hsize_t to, hsize_t first, hsize_t count, void* out,
                  const std::string& path, const std::string& full) {
  rehearsal_checkpoint();
  h5::Handle file_space = h5::space_handle(H5Dget_space(ds), path, "H5Dget_space");
  hsize_t start[2] = {from, first};
  hsize_t extent[2] = {to - from, count};
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, extent, nullptr), path,
            "H5Sselect_hyperslab");
  h5::Handle mem_space = h5::space_handle(H5Screate_simple(2, extent, nullptr), path, "H5Screate");
  h5::check(H5Dread(ds, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, out), path,
            "cannot read " + full + " (corrupt file?)");
}

// One per-layer table's blocks [from, to): min, max and last of each layer
// from `values` ([n x 3L]), NaN and Inf counts from `counts` ([n x 2L]).
void read_layer_stats(hid_t file, const std::string& group, const std::string& name, hsize_t from, hsize_t to,
                      hsize_t capacity, int64_t block_rows, BlockStats<float>& stats, const std::string& path) {
  const hsize_t n = to - from, layers = stats.width;
  const std::string counts_name = name + "_counts";
  h5::Handle values = dataset_of_rows(file, group, name.c_str(), to, 3 * layers, sizeof(float), path);
  h5::Handle counts = dataset_of_rows(file, group, counts_name.c_str(), to, 2 * layers, sizeof(uint32_t), path);
  std::vector<float>* fields[] = {&stats.min, &stats.max, &stats.last};
  for (hsize_t f = 0; f < 3; ++f) {
    reserve_bulk(*fields[f], capacity * layers);
    resize_bulk(*fields[f], n * layers);
    read_columns(values.get(), H5T_NATIVE_FLOAT, from, to, f * layers, layers, fields[f]->data(), path,
                 group + "/" + name);
  }
  std::vector<uint32_t>* count_fields[] = {&stats.nan, &stats.inf};
  for (hsize_t f = 0; f < 2; ++f) {
    reserve_bulk(*count_fields[f], capacity * layers);
    resize_bulk(*count_fields[f], n * layers);
    read_columns(counts.get(), H5T_NATIVE_UINT32, from, to, f * layers, layers, count_fields[f]->data(), path,
                 group + "/" + counts_name);
  }
  for (size_t i = 0; i < n * layers; ++i)
    if (int64_t(stats.nan[i]) + int64_t(stats.inf[i]) > block_rows)
      throw FormatError(path, group + " counts more non-finite values than a block has rows (corrupt file?)");
}

}  // namespace

OverviewLevel read_overview_blocks(hid_t file, const StoredOverview& stored, size_t level, hsize_t from, hsize_t to,
                                   const std::string& path, hsize_t capacity) {
  OverviewLevel out = empty_overview_level(level, stored.layers, stored.act_absmax);
  if (to <= from) return out;
  const std::string group = level_group(level);
  const hsize_t n = to - from;
  capacity = std::max(capacity, n);
  // Each dataset is checked against what the file can hold before its rows are allocated.
  auto read = [&](const char* name, hid_t type, hsize_t columns, auto& into) {
    h5::Handle ds = dataset_of_rows(file, group, name, to, columns, sizeof(into[0]), path);
    into.resize(n * columns);
    read_row_range(ds.get(), type, from, to, columns, into.data(), path, group + "/" + name);
  };
  std::vector<int64_t> blocks;
  std::vector<double> scalars;
  read("blocks", H5T_NATIVE_INT64, kBlockFields, blocks);
  read("scalars", H5T_NATIVE_DOUBLE, kOverviewScalars * kScalarFields, scalars);
  const int64_t block_rows = kOverviewBlockRows[level];
  for (auto* v : {&out.first_step, &out.last_step, &out.rows, &out.skipped}) v->reserve(capacity);
  out.scalars.reserve_blocks(capacity);
  for (hsize_t b = 0; b < n; ++b) {
    const int64_t* f = &blocks[b * kBlockFields];
    const std::string what = group + " block " + std::to_string(from + b);
    // A complete block: its rows are the level's, its steps ascending.
    if (f[2] != block_rows || f[3] < 0 || f[3] > block_rows || f[1] < f[0] || (b > 0 && f[0] <= out.last_step.back()))
      throw FormatError(path, what + " is not a block of " + std::to_string(block_rows) + " rows (corrupt file?)");
    out.first_step.push_back(f[0]);
    out.last_step.push_back(f[1]);
    out.rows.push_back(f[2]);
    out.skipped.push_back(f[3]);
    const double* s = &scalars[b * kOverviewScalars * kScalarFields];
    for (size_t i = 0; i < kOverviewScalars; ++i, s += kScalarFields) {
      out.scalars.min.push_back(s[0]);
      out.scalars.max.push_back(s[1]);
      out.scalars.last.push_back(s[2]);
      out.scalars.nan.push_back(checked_count(s[3], block_rows, path, what));
      out.scalars.inf.push_back(checked_count(s[4], block_rows, path, what));
    }
  }
  if (stored.layers > 0)
    read_layer_stats(file, group, "layer_grad_norm", from, to, capacity, block_rows, out.layer_grad_norm, path);
  if (stored.act_absmax)
    read_layer_stats(file, group, "layer_act_absmax", from, to, capacity, block_rows, out.layer_act_absmax, path);
  return out;
}

RunData read_step_rows(hid_t file, hsize_t from, hsize_t to, size_t layers, bool grad, bool act,
                       const std::string& path) {
  RunData out;
  const std::string steps = run_schema::kStepsGroup;
  auto column = [&](const char* name, hid_t type, hsize_t columns, auto& into) {
    h5::Handle ds = dataset_of_rows(file, steps, name, to, columns, sizeof(into[0]), path);
    into.resize((to - from) * std::max<hsize_t>(1, columns));
    read_row_range(ds.get(), type, from, to, columns, into.data(), path, steps + "/" + name);
  };
  column("step", H5T_NATIVE_INT64, 0, out.step);
  column("loss", H5T_NATIVE_DOUBLE, 0, out.loss);
  column("lr", H5T_NATIVE_DOUBLE, 0, out.lr);
  column("loss_scale", H5T_NATIVE_DOUBLE, 0, out.loss_scale);
  column("grad_norm", H5T_NATIVE_DOUBLE, 0, out.grad_norm);
  column("step_time", H5T_NATIVE_DOUBLE, 0, out.step_time);
  column("skipped", H5T_NATIVE_UINT8, 0, out.skipped);
  out.layer_names.resize(layers);
  if (grad) column("layer_grad_norm", H5T_NATIVE_FLOAT, layers, out.layer_grad_norm);
  if (act) column("layer_act_absmax", H5T_NATIVE_FLOAT, layers, out.layer_act_absmax);
  return out;
}

void seed_open_blocks(OverviewBuilder& builder, hid_t file, const StoredOverview& stored, hsize_t rows,
                      const std::string& path) {
  for (size_t k = 0; k + 1 < stored.blocks.size(); ++k) {
    const hsize_t per_next = hsize_t(kOverviewBlockRows[k + 1] / kOverviewBlockRows[k]);
    const OverviewLevel seeds =
        read_overview_blocks(file, stored, k, stored.blocks[k + 1] * per_next, stored.blocks[k], path);
    for (size_t b = 0; b < seeds.blocks(); ++b) builder.add_stored_block(k, seeds, b);
  }
  const hsize_t from = stored.blocks[0] * hsize_t(kOverviewBlockRows[0]);
  const RunData tail = read_step_rows(file, from, rows, stored.layers, stored.layers > 0, stored.act_absmax, path);
  builder.add(rows_view(tail, 0, tail.rows()));
}

// The rows every step column holds (a SWMR writer extends them one by one).
hsize_t committed_rows(hid_t file, bool grad, bool act, const std::string& path) {
  hsize_t rows = hsize_t(-1);
  std::vector<std::string> names(std::begin(run_schema::kScalarStepColumns), std::end(run_schema::kScalarStepColumns));
  if (grad) names.push_back("layer_grad_norm");
  if (act) names.push_back("layer_act_absmax");
  for (const std::string& name : names) {
    h5::Handle ds = open_dataset(file, run_schema::kStepsGroup, name, path);
    const std::vector<hsize_t> dims = refreshed_dims(ds.get(), path, name);
    rows = std::min<hsize_t>(rows, dims.empty() ? 0 : dims[0]);
  }
  return rows;
}

}  // namespace nanscope::format
