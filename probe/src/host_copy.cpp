#include "nanscope/probe/host_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "host_memory.hpp"

namespace nanscope::probe {

namespace {

// The same bytes in the same places: a plain dense CPU tensor each, laid out alike.
bool copies_as_bytes(const at::Tensor& dst, const at::Tensor& src) {
  return in_host_memory(dst) && in_host_memory(src) && dst.scalar_type() == src.scalar_type() && !src.is_conj() &&
         !src.is_neg() && !dst.requires_grad() && dst.sizes() == src.sizes() && dst.strides() == src.strides() &&
         src.is_non_overlapping_and_dense();
}

// From this size on a copy is streamed past the caches. Smaller ones (a
// BatchNorm's statistics) stay where the next step finds them anyway.
constexpr size_t kStreamFrom = 64 * 1024;

// What the guard keeps is read again only if a step fails: written with
// streaming stores, the copy neither reads the destination's lines in first
// nor pushes the step's own working set out of the caches (a micro-batch of
// 200 KB took a tenth of a small step's L2). About a quarter faster than
// memcpy on its own, where the source has left the caches.
void stream_bytes(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t head = (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16;  // to the stores' alignment
  std::memcpy(out, in, head);
  size_t at = head;
  for (; at + 64 <= bytes; at += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + at), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 48), d);
  }
  std::memcpy(out + at, in + at, bytes - at);
  _mm_sfence();  // the streamed lines are visible to any thread that reads them next
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

void copy_into(const at::Tensor& dst, const at::Tensor& src) {
  if (!copies_as_bytes(dst, src)) {
    dst.copy_(src);
    return;
  }
  const size_t bytes = size_t(src.numel()) * src.element_size();
  if (bytes >= kStreamFrom)
    stream_bytes(dst.data_ptr(), src.data_ptr(), bytes);
  else if (bytes > 0)
    std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
}

}  // namespace nanscope::probe
