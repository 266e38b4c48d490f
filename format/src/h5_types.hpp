#pragma once
// How each nanscope DType is stored in HDF5 and read into memory, shared by
// the archive and the data-file reader.
#include <hdf5.h>

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

}  // namespace nanscope::format::h5
