#pragma once
// Conversions between at::Tensor and the format library's plain TensorData.
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "nanscope/format/archive.hpp"

namespace nanscope::probe {

format::DType to_format_dtype(at::ScalarType type);
at::ScalarType to_scalar_type(format::DType dtype);
// Copies a tensor (any device) to host bytes.
format::TensorData tensor_to_data(const at::Tensor& tensor);
// A CPU tensor owning a copy of the bytes.
at::Tensor tensor_from_data(const format::TensorData& data);
// An integer tensor's values (a batch's data set rows); empty when undefined.
std::vector<int64_t> long_values(const at::Tensor& tensor);

void put_tensor(const format::Group& group, const std::string& name, const at::Tensor& tensor);
at::Tensor get_tensor(const format::Group& group, const std::string& name);

// Named tensors in order (parameters, optimizer slots), one dataset each,
// streamed: a tensor at a time is copied to the host.
using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;
void put_named(const format::Group& group, const NamedTensorList& tensors);
NamedTensorList get_named(const format::Group& group);

}  // namespace nanscope::probe
