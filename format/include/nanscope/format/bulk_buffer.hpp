#pragma once
// Large buffers filled in one go: a run file's columns, the viewer's layer
// pyramids. The first touch of each 4 KiB page is a page fault, and on some
// virtual machines those faults are most of the time it takes to read a big
// run file (measured: bench/viewer_scale). Backing such a buffer with
// transparent huge pages cuts the faults 512-fold where the kernel allows it
// (its "madvise" mode, Debian's default); elsewhere this is a plain resize.
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

namespace nanscope::format {

namespace detail {
inline constexpr size_t kHugePage = size_t(2) << 20;
// Buffers below this keep ordinary pages: too small to be worth a huge one.
inline constexpr size_t kBulkBytes = 4 * kHugePage;

inline void advise_huge_pages([[maybe_unused]] void* data, [[maybe_unused]] size_t bytes) {
#ifdef MADV_HUGEPAGE
  const auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~uintptr_t(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice: failure is fine
#endif
}
}  // namespace detail

// v.reserve(n), except that a large new buffer is advised into huge pages
// before anything touches it. Room reserved and never written costs address
// space, not memory.
template <typename T>
void reserve_bulk(std::vector<T>& v, size_t n) {
  if (n <= v.capacity()) return;
  if (n * sizeof(T) < detail::kBulkBytes) {
    v.reserve(n);
    return;
  }
  std::vector<T> grown;
  grown.reserve(n);
  detail::advise_huge_pages(grown.data(), grown.capacity() * sizeof(T));
  grown.insert(grown.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
  v.swap(grown);
}

// v.resize(n), with a large new buffer advised into huge pages as
// reserve_bulk does. Grows geometrically, as resize does.
template <typename T>
void resize_bulk(std::vector<T>& v, size_t n) {
  if (n > v.capacity() && n * sizeof(T) >= detail::kBulkBytes) reserve_bulk(v, std::max(n, 2 * v.capacity()));
  v.resize(n);
}

}  // namespace nanscope::format
