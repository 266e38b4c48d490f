#pragma once
// Training data files: any HDF5 file with /inputs and /targets whose first
// dimension is the sample (as h5py writes them). No nanscope identity needed.
#include <string>

#include "nanscope/format/archive.hpp"

namespace nanscope::format {

struct DataFile {
  TensorData inputs;
  TensorData targets;
};

// Throws FormatError naming the file for missing datasets, unsupported types,
// or inputs and targets with different sample counts.
DataFile read_data_file(const std::string& path);
void write_data_file(const std::string& path, const DataFile& data);

}  // namespace nanscope::format
