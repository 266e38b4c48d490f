#pragma once
// How each nanscope DType is stored in HDF5 and read into memory, shared by
// the archive and the data-file reader.
#include <hdf5.h>

#include <string>
#include <vector>

#include "h5.hpp"
#include "nanscope/format/archive.hpp"

namespace nanscope::format::h5 {

// HDF5 1.10 has no half or bfloat16 type: both are stored as uint16 with the
// `dtype` attribute saying how to view them (numpy: .view(np.float16)).
inline hid_t file_type(DType dtype) {
  switch (dtype) {
    case DType::float32: return H5T_IEEE_F32LE;
    case DType::float64: return H5T_IEEE_F64LE;
    case DType::float16:
    case DType::bfloat16: return H5T_STD_U16LE;
    case DType::int16: return H5T_STD_I16LE;
    case DType::int64: return H5T_STD_I64LE;
    case DType::int32: return H5T_STD_I32LE;
    case DType::int8: return H5T_STD_I8LE;
    case DType::uint8:
    case DType::boolean: return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

inline hid_t memory_type(DType dtype) {
  switch (dtype) {
    case DType::float32: return H5T_NATIVE_FLOAT;
    case DType::float64: return H5T_NATIVE_DOUBLE;
    case DType::float16:
    case DType::bfloat16: return H5T_NATIVE_UINT16;
    case DType::int16: return H5T_NATIVE_INT16;
    case DType::int64: return H5T_NATIVE_INT64;
    case DType::int32: return H5T_NATIVE_INT32;
    case DType::int8: return H5T_NATIVE_INT8;
    case DType::uint8:
    case DType::boolean: return H5T_NATIVE_UINT8;
  }
  return H5T_NATIVE_UINT8;
}

// A dataset's whole contents into `out` as out.dtype: its shape, then its
// bytes, sized from the shape and checked against what the file can hold
// before anything is allocated. Throws FormatError naming `what`.
inline std::vector<hsize_t> dataset_dims(hid_t dataset, const std::string& path, const std::string& what) {
  Handle space = space_handle(H5Dget_space(dataset), path, "H5Dget_space");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw FormatError(path, what + " has no simple shape");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

inline void read_tensor_data(hid_t dataset, TensorData& out, const std::string& path, const std::string& what) {
  const std::vector<hsize_t> dims = dataset_dims(dataset, path, what);
  out.shape.assign(dims.begin(), dims.end());
  out.bytes.resize(checked_bytes(dataset, dims, dtype_size(out.dtype), path, what));
  if (!out.bytes.empty())
    check(H5Dread(dataset, memory_type(out.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.bytes.data()), path,
          "cannot read " + what + " (corrupt or truncated file?)");
}

}  // namespace nanscope::format::h5
