#include "nanscope/probe/tensor_io.hpp"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace nanscope::probe {

format::DType to_format_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return format::DType::float32;
    case at::kDouble: return format::DType::float64;
    case at::kHalf: return format::DType::float16;
    case at::kBFloat16: return format::DType::bfloat16;
    case at::kLong: return format::DType::int64;
    case at::kInt: return format::DType::int32;
    case at::kShort: return format::DType::int16;
    case at::kChar: return format::DType::int8;
    case at::kByte: return format::DType::uint8;
    case at::kBool: return format::DType::boolean;
    default: throw std::invalid_argument(std::string("cannot store tensors of type ") + c10::toString(type));
  }
}

at::ScalarType to_scalar_type(format::DType dtype) {
  switch (dtype) {
    case format::DType::float32: return at::kFloat;
    case format::DType::float64: return at::kDouble;
    case format::DType::float16: return at::kHalf;
    case format::DType::bfloat16: return at::kBFloat16;
    case format::DType::int64: return at::kLong;
    case format::DType::int32: return at::kInt;
    case format::DType::int16: return at::kShort;
    case format::DType::int8: return at::kChar;
    case format::DType::uint8: return at::kByte;
    case format::DType::boolean: return at::kBool;
  }
  return at::kFloat;
}

std::vector<int64_t> long_values(const at::Tensor& tensor) {
  if (!tensor.defined()) return {};
  const at::Tensor c = tensor.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

format::TensorData tensor_to_data(const at::Tensor& tensor) {
  at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
  format::TensorData data;
  data.dtype = to_format_dtype(host.scalar_type());
  data.shape.assign(host.sizes().begin(), host.sizes().end());
  data.bytes.resize(host.numel() * host.element_size());
  if (!data.bytes.empty()) std::memcpy(data.bytes.data(), host.data_ptr(), data.bytes.size());
  return data;
}

at::Tensor tensor_from_data(const format::TensorData& data) {
  at::Tensor out = at::empty(data.shape, at::TensorOptions().dtype(to_scalar_type(data.dtype)));
  if (!data.bytes.empty()) std::memcpy(out.data_ptr(), data.bytes.data(), data.bytes.size());
  return out;
}

void put_tensor(const format::Group& group, const std::string& name, const at::Tensor& tensor) {
  // Straight from the tensor's memory where it can be (on the host, dense):
  // writing a model then costs no copy of it. Otherwise one host copy of this tensor.
  const at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
  const std::vector<int64_t> shape(host.sizes().begin(), host.sizes().end());
  group.put_tensor(name, to_format_dtype(host.scalar_type()), shape, host.data_ptr());
}

at::Tensor get_tensor(const format::Group& group, const std::string& name) {
  return tensor_from_data(group.tensor(name));
}

void put_named(const format::Group& g, const NamedTensorList& tensors) {
  g.set_attr("count", int64_t(tensors.size()));
  // Names may hold '/', which HDF5 reads as a path: number the datasets and
  // keep the names as attributes, in order.
  for (size_t i = 0; i < tensors.size(); ++i) {
    char key[24];
    std::snprintf(key, sizeof key, "%06zu", i);
    put_tensor(g, key, tensors[i].second);
    g.set_attr(std::string("name_") + key, tensors[i].first);
  }
}

NamedTensorList get_named(const format::Group& g) {
  NamedTensorList out;
  const int64_t n = g.attr_int("count");
  for (int64_t i = 0; i < n; ++i) {
    char key[24];
    std::snprintf(key, sizeof key, "%06lld", static_cast<long long>(i));
    out.emplace_back(g.attr_string(std::string("name_") + key), get_tensor(g, key));
  }
  return out;
}

}  // namespace nanscope::probe
