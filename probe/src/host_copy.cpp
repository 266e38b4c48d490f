#include "nanscope/probe/host_copy.hpp"

#include <cstring>

#include "host_memory.hpp"

namespace nanscope::probe {

namespace {

// The same bytes in the same places: a plain dense CPU tensor each, laid out alike.
bool copies_as_bytes(const at::Tensor& dst, const at::Tensor& src) {
  return in_host_memory(dst) && in_host_memory(src) && dst.scalar_type() == src.scalar_type() && !src.is_conj() &&
         !src.is_neg() && !dst.requires_grad() && dst.sizes() == src.sizes() && dst.strides() == src.strides() &&
         src.is_non_overlapping_and_dense();
}

}  // namespace

void copy_into(const at::Tensor& dst, const at::Tensor& src) {
  if (!copies_as_bytes(dst, src)) {
    dst.copy_(src);
    return;
  }
  const size_t bytes = size_t(src.numel()) * src.element_size();
  if (bytes > 0) std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
}

}  // namespace nanscope::probe
