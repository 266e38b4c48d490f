#include "nanscope/probe/tensor_io.hpp"

#include <cstring>
#include <stdexcept>

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
  format::TensorData data = tensor_to_data(tensor);
  group.put_tensor(name, data.dtype, data.shape, data.bytes.data());
}

at::Tensor get_tensor(const format::Group& group, const std::string& name) {
  return tensor_from_data(group.tensor(name));
}

}  // namespace nanscope::probe
