#include "nanscope/format/data_file.hpp"

#include "h5.hpp"
#include "h5_types.hpp"
#include "nanscope/format/error.hpp"
#include "rehearsal.hpp"

namespace nanscope::format {

namespace {

// Maps a stored HDF5 type to the DType it is read as.
DType dtype_of(hid_t type, const std::string& path, const std::string& name) {
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      if (size == 4) return DType::float32;
      if (size == 8) return DType::float64;
      break;
    case H5T_INTEGER: {
      const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
      if (is_signed && size == 8) return DType::int64;
      if (is_signed && size == 4) return DType::int32;
      if (is_signed && size == 2) return DType::int16;
      if (is_signed && size == 1) return DType::int8;
      if (!is_signed && size == 1) return DType::uint8;
      break;
    }
    default: break;
  }
  throw FormatError(path, name + " has an unsupported element type (use float32/64 or int)");
}

TensorData read_array(hid_t file, const std::string& name, const std::string& path) {
  if (!h5::link_exists(file, name)) throw FormatError(path, name + " missing (a data file needs /inputs and /targets)");
  h5::Handle ds = h5::dataset_handle(H5Dopen2(file, name.c_str(), H5P_DEFAULT), path, "cannot open " + name);
  h5::Handle type = h5::type_handle(H5Dget_type(ds.get()), path, "H5Dget_type");
  TensorData out;
  out.dtype = dtype_of(type.get(), path, name);
  {
    h5::Handle space = h5::space_handle(H5Dget_space(ds.get()), path, "H5Dget_space");
    if (H5Sget_simple_extent_ndims(space.get()) < 1) throw FormatError(path, name + " must have a sample dimension");
  }
  h5::read_tensor_data(ds.get(), out, path, name);
  return out;
}

void write_array(hid_t file, const std::string& name, const TensorData& t, const std::string& path) {
  std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
  h5::Handle space = h5::space_handle(H5Screate_simple(int(dims.size()), dims.data(), nullptr), path, "H5Screate");
  hid_t mem = h5::memory_type(t.dtype);
  h5::Handle ds =
      h5::dataset_handle(H5Dcreate2(file, name.c_str(), mem, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path,
                         "cannot create " + name);
  if (!t.bytes.empty())
    h5::check(H5Dwrite(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.bytes.data()), path, "cannot write " + name);
}

}  // namespace

DataFile read_data_file(const std::string& path) {
  h5::rehearse_in_child(path, [&] { read_data_file(path); });
  h5::Handle file = h5::open_file_readonly(path);
  DataFile data{read_array(file.get(), "/inputs", path), read_array(file.get(), "/targets", path)};
  if (data.inputs.shape[0] != data.targets.shape[0])
    throw FormatError(path, "/inputs has " + std::to_string(data.inputs.shape[0]) + " samples but /targets has " +
                                std::to_string(data.targets.shape[0]));
  if (data.inputs.shape[0] == 0) throw FormatError(path, "holds no samples");
  return data;
}

void write_data_file(const std::string& path, const DataFile& data) {
  h5::silence_errors();
  h5::Handle file = h5::file_handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path,
                                    "cannot create data file");
  write_array(file.get(), "/inputs", data.inputs, path);
  write_array(file.get(), "/targets", data.targets, path);
}

}  // namespace nanscope::format
