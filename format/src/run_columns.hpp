#pragma once
// run.h5's columns: extendible chunked datasets of rows, as the run writer
// appends to them and drops rows from (the steps, the events, the overview),
// and as the readers read row ranges of them while a writer may still append.
#include <algorithm>
#include <string>
#include <vector>

#include "h5.hpp"
#include "nanscope/format/bulk_buffer.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/rehearsal.hpp"

namespace nanscope::format {

// An extendible chunked dataset of `columns` values per row (0: 1-D).
struct Column {
  h5::Handle dataset;
  hid_t mem_type = -1;
  hsize_t columns = 0;
};

inline Column create_column(hid_t group, const char* name, hid_t file_type, hid_t mem_type, hsize_t columns,
                            const std::string& path) {
  const int rank = columns == 0 ? 1 : 2;
  hsize_t dims[2] = {0, columns};
  hsize_t max_dims[2] = {H5S_UNLIMITED, columns};
  // ~8 KiB chunks: a short run stays small on disk, a 100k-step column is
  // still only ~100 chunks.
  hsize_t row_bytes = std::max<hsize_t>(1, columns) * H5Tget_size(file_type);
  hsize_t chunk_rows = std::clamp<hsize_t>(8192 / row_bytes, 16, 1024);
  hsize_t chunk[2] = {chunk_rows, std::max<hsize_t>(1, columns)};
  h5::Handle space = h5::space_handle(H5Screate_simple(rank, dims, max_dims), path, "H5Screate");
  h5::Handle plist = h5::plist_handle(H5Pcreate(H5P_DATASET_CREATE), path, "H5Pcreate");
  h5::check(H5Pset_chunk(plist.get(), rank, chunk), path, "H5Pset_chunk");
  Column column;
  column.dataset =
      h5::dataset_handle(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT), path,
                         std::string("cannot create dataset ") + name);
  column.mem_type = mem_type;
  column.columns = columns;
  return column;
}

// Appends `rows` rows held contiguously at `data`.
inline void append_rows(Column& column, const void* data, hsize_t rows, const std::string& path) {
  if (rows == 0) return;
  const int rank = column.columns == 0 ? 1 : 2;
  hid_t ds = column.dataset.get();
  h5::Handle file_space = h5::space_handle(H5Dget_space(ds), path, "H5Dget_space");
  hsize_t old_dims[2] = {0, 0};
  H5Sget_simple_extent_dims(file_space.get(), old_dims, nullptr);
  hsize_t new_dims[2] = {old_dims[0] + rows, column.columns};
  h5::check(H5Dset_extent(ds, new_dims), path, "cannot extend dataset");
  file_space = h5::space_handle(H5Dget_space(ds), path, "H5Dget_space");
  hsize_t start[2] = {old_dims[0], 0};
  hsize_t count[2] = {rows, column.columns};
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path,
            "H5Sselect_hyperslab");
  h5::Handle mem_space = h5::space_handle(H5Screate_simple(rank, count, nullptr), path, "H5Screate");
  if (H5Dwrite(ds, column.mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data) < 0)
    throw WriteError(path, "cannot write rows (disk full?)");
}

inline Column open_column(hid_t group, const char* name, hid_t mem_type, const std::string& path) {
  Column column;
  column.dataset =
      h5::dataset_handle(H5Dopen2(group, name, H5P_DEFAULT), path, std::string("cannot open dataset ") + name);
  column.mem_type = mem_type;
  h5::Handle space = h5::space_handle(H5Dget_space(column.dataset.get()), path, "H5Dget_space");
  hsize_t dims[2] = {0, 0};
  const int rank = H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  column.columns = rank == 2 ? dims[1] : 0;
  return column;
}

inline hsize_t row_count(const Column& column, const std::string& path) {
  h5::Handle space = h5::space_handle(H5Dget_space(column.dataset.get()), path, "H5Dget_space");
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  return dims[0];
}

// Drops the rows from `rows` on.
inline void truncate(Column& column, hsize_t rows, const std::string& path) {
  if (!column.dataset.valid()) return;
  hsize_t dims[2] = {rows, column.columns};
  h5::check(H5Dset_extent(column.dataset.get(), dims), path, "cannot drop rows");
}

// Dimensions of a dataset, refreshed first so a live SWMR writer's appends show.
inline std::vector<hsize_t> refreshed_dims(hid_t ds, const std::string& path, const std::string& name) {
  H5Drefresh(ds);  // fails harmlessly on a file not opened for SWMR reading
  h5::Handle space = h5::space_handle(H5Dget_space(ds), path, "H5Dget_space " + name);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw FormatError(path, "dataset " + name + " has no simple shape");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

inline h5::Handle open_dataset(hid_t loc, const std::string& group, const std::string& name, const std::string& path) {
  std::string full = group + "/" + name;
  if (!h5::link_exists(loc, full)) throw FormatError(path, full + " missing");
  return h5::dataset_handle(H5Dopen2(loc, full.c_str(), H5P_DEFAULT), path, "cannot open " + full);
}

// Checks a dataset of `columns` values per row (0: 1-D) holds at least
// `rows` rows whose bytes the file can hold, and returns it opened.
inline h5::Handle dataset_of_rows(hid_t loc, const std::string& group, const std::string& name, hsize_t rows,
                                  hsize_t columns, size_t element_size, const std::string& path) {
  h5::Handle ds = open_dataset(loc, group, name, path);
  auto dims = refreshed_dims(ds.get(), path, name);
  const std::string full = group + "/" + name;
  if (dims.empty() || dims[0] < rows)
    throw FormatError(path, full + " has fewer rows than /steps/step (truncated file?)");
  if ((columns == 0 && dims.size() != 1) || (columns > 0 && (dims.size() != 2 || dims[1] != columns)))
    throw FormatError(path, full + " has an unexpected shape");
  h5::checked_bytes(ds.get(), {rows, std::max<hsize_t>(1, columns)}, element_size, path, full);
  return ds;
}

// Reads rows [from, to) of an opened dataset into `out` (room for them).
inline void read_row_range(hid_t ds, hid_t mem_type, hsize_t from, hsize_t to, hsize_t columns, void* out,
                           const std::string& path, const std::string& full) {
  if (to <= from) return;
  rehearsal_checkpoint();
  h5::Handle file_space = h5::space_handle(H5Dget_space(ds), path, "H5Dget_space");
  hsize_t start[2] = {from, 0};
  hsize_t count[2] = {to - from, columns};
  const int rank = columns == 0 ? 1 : 2;
  h5::check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr), path,
            "H5Sselect_hyperslab");
  h5::Handle mem_space = h5::space_handle(H5Screate_simple(rank, count, nullptr), path, "H5Screate");
  h5::check(H5Dread(ds, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, out), path,
            "cannot read " + full + " (corrupt file?)");
}

// Reads rows [from, to) (x `columns`; 0: a 1-D dataset) of a dataset into
// `out`, which already holds the first `from` rows and grows to `to`, with
// room for `capacity_rows` (a follower's: rows appended later then never
// move the whole column).
template <typename T>
void read_rows(hid_t loc, const std::string& group, const std::string& name, hid_t mem_type, hsize_t from, hsize_t to,
               hsize_t columns, std::vector<T>& out, const std::string& path, hsize_t capacity_rows = 0) {
  h5::Handle ds = dataset_of_rows(loc, group, name, to, columns, sizeof(T), path);
  const hsize_t width = std::max<hsize_t>(1, columns);
  reserve_bulk(out, std::max(capacity_rows, to) * width);
  resize_bulk(out, to * width);
  read_row_range(ds.get(), mem_type, from, to, columns, out.data() + from * width, path, group + "/" + name);
}

}  // namespace nanscope::format
