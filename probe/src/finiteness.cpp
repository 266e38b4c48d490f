#include "nanscope/probe/finiteness.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>

#include "host_memory.hpp"
#include "vector_clones.hpp"

namespace nanscope::probe {

namespace {

// The host scans' loops, one per width of a value's bits. A value is NaN or
// infinite exactly when its exponent bits are all ones (an or over the bits);
// with the sign cleared, the integer order of the bits is the order of the
// magnitudes, NaN above infinity (an integer max). Both vectorize.

template <typename Bits>
inline __attribute__((always_inline)) bool any_saturated(const Bits* values, int64_t n, Bits exponent) {
  Bits hit = 0;
  for (int64_t i = 0; i < n; ++i) hit |= Bits((values[i] & exponent) == exponent);
  return hit != 0;
}
template <typename Bits>
inline __attribute__((always_inline)) Bits largest_bits(const Bits* values, int64_t n, Bits magnitude) {
  Bits largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max<Bits>(largest, values[i] & magnitude);
  return largest;
}

// Not templates: target_clones needs a function of its own for each width.
NANSCOPE_VECTOR_CLONES bool any_saturated_bits(const uint16_t* v, int64_t n, uint16_t e) {
  return any_saturated(v, n, e);
}
NANSCOPE_VECTOR_CLONES bool any_saturated_bits(const uint32_t* v, int64_t n, uint32_t e) {
  return any_saturated(v, n, e);
}
NANSCOPE_VECTOR_CLONES bool any_saturated_bits(const uint64_t* v, int64_t n, uint64_t e) {
  return any_saturated(v, n, e);
}
NANSCOPE_VECTOR_CLONES uint16_t largest_magnitude(const uint16_t* v, int64_t n, uint16_t m) {
  return largest_bits(v, n, m);
}
NANSCOPE_VECTOR_CLONES uint32_t largest_magnitude(const uint32_t* v, int64_t n, uint32_t m) {
  return largest_bits(v, n, m);
}
NANSCOPE_VECTOR_CLONES uint64_t largest_magnitude(const uint64_t* v, int64_t n, uint64_t m) {
  return largest_bits(v, n, m);
}

// Small tensors (a batch, a BatchNorm's statistics) in one pass on this
// thread; large ones in pieces on LibTorch's threads.
constexpr int64_t kGrain = int64_t(1) << 18;

template <typename Bits>
bool exponent_saturated_anywhere(const void* data, int64_t n, Bits exponent) {
  const Bits* values = static_cast<const Bits*>(data);
  std::atomic<bool> found{false};
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (any_saturated_bits(values + begin, end - begin, exponent)) found.store(true, std::memory_order_relaxed);
  });
  return found.load(std::memory_order_relaxed);
}

// Whether a CPU tensor holds a NaN or an infinity, read where it lies; nullopt
// when it cannot be (another device, a layout or type read by kernels only).
// The checks of a clean step run on small tensors, where the dispatcher's
// fixed cost of a kernel (and of the composite isfinite in LibTorch 1.13)
// is most of what a check costs.
std::optional<bool> nonfinite_on_host(const at::Tensor& t) {
  if (!in_host_memory(t) || !t.is_contiguous()) return std::nullopt;
  if (!at::isFloatingType(t.scalar_type())) {
    if (at::isComplexType(t.scalar_type())) return std::nullopt;
    return false;  // integers and bools hold no NaN
  }
  const void* data = t.data_ptr();
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case at::kFloat: return exponent_saturated_anywhere<uint32_t>(data, n, 0x7f800000u);
    case at::kDouble: return exponent_saturated_anywhere<uint64_t>(data, n, 0x7ff0000000000000ull);
    case at::kBFloat16: return exponent_saturated_anywhere<uint16_t>(data, n, uint16_t(0x7f80));
    case at::kHalf: return exponent_saturated_anywhere<uint16_t>(data, n, uint16_t(0x7c00));
    default: return std::nullopt;
  }
}

template <typename Bits>
Bits largest_magnitude_bits(const void* data, int64_t n, Bits magnitude) {
  const Bits* values = static_cast<const Bits*>(data);
  return at::parallel_reduce(
      0, n, kGrain, Bits(0),
      [&](int64_t begin, int64_t end, Bits largest) {
        return std::max(largest, largest_magnitude(values + begin, end - begin, magnitude));
      },
      [](Bits a, Bits b) { return std::max(a, b); });
}

template <typename Float, typename Bits>
float as_float(Bits bits) {
  Float value;
  std::memcpy(&value, &bits, sizeof value);
  return float(value);
}

std::optional<float> abs_max_on_host(const at::Tensor& t) {
  if (!in_host_memory(t) || !t.is_contiguous() || t.numel() == 0) return std::nullopt;
  const void* data = t.data_ptr();
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case at::kFloat: return as_float<float>(largest_magnitude_bits<uint32_t>(data, n, 0x7fffffffu));
    case at::kDouble: return as_float<double>(largest_magnitude_bits<uint64_t>(data, n, 0x7fffffffffffffffull));
    case at::kBFloat16:
      return as_float<float>(uint32_t(largest_magnitude_bits<uint16_t>(data, n, uint16_t(0x7fff))) << 16);
    case at::kHalf:
      return float(c10::Half(largest_magnitude_bits<uint16_t>(data, n, uint16_t(0x7fff)), c10::Half::from_bits()));
    default: return std::nullopt;
  }
}

// One flag per tensor read on the host, or nullopt when any must go to a kernel.
std::optional<std::vector<bool>> nonfinite_each_on_host(const std::vector<at::Tensor>& tensors) {
  std::vector<bool> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    const std::optional<bool> bad = t.numel() == 0 ? std::optional<bool>(false) : nonfinite_on_host(t);
    if (!bad) return std::nullopt;
    out.push_back(*bad);
  }
  return out;
}

// The smallest and largest value; LibTorch 1.13 has no CPU aminmax for fp16.
std::tuple<at::Tensor, at::Tensor> min_max(const at::Tensor& t) {
  if (t.scalar_type() == at::kHalf && t.is_cpu()) return {t.min(), t.max()};
  return at::aminmax(t);
}

// One value per tensor (the largest magnitude) or two (smallest and largest),
// stacked: a NaN or an infinity in a tensor shows in its own. `per_tensor`
// says which. Every tensor given has values.
at::Tensor stacked_extremes(const std::vector<at::Tensor>& present, const at::Device device, int64_t& per_tensor) {
  bool all_cuda = true;
  for (const at::Tensor& t : present) all_cuda = all_cuda && t.is_cuda();
  if (all_cuda) {
    per_tensor = 1;
    std::vector<at::Tensor> detached;  // a tensor that requires grad records no graph here
    detached.reserve(present.size());
    for (const at::Tensor& t : present) detached.push_back(t.detach());
    return at::stack(at::_foreach_norm(detached, std::numeric_limits<double>::infinity()));
  }
  per_tensor = 2;
  std::vector<at::Tensor> extremes;
  extremes.reserve(2 * present.size());
  for (const at::Tensor& t : present) {
    auto [lo, hi] = min_max(t.detach());
    extremes.push_back(t.device() == device ? lo : lo.to(device));
    extremes.push_back(t.device() == device ? hi : hi.to(device));
  }
  return at::stack(extremes);
}

std::vector<at::Tensor> with_values(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> present;
  present.reserve(tensors.size());
  for (const at::Tensor& t : tensors)
    if (t.numel() > 0) present.push_back(t);
  return present;
}

}  // namespace

at::Tensor finite_each(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::ones({0}, at::kBool);
  const at::Device device = tensors.front().device();
  if (device.is_cpu())
    if (const std::optional<std::vector<bool>> bad = nonfinite_each_on_host(tensors)) {
      at::Tensor finite = at::empty({int64_t(tensors.size())}, at::kBool);
      bool* out = finite.data_ptr<bool>();
      for (size_t i = 0; i < bad->size(); ++i) out[i] = !(*bad)[i];
      return finite;
    }
  const std::vector<at::Tensor> present = with_values(tensors);
  if (present.empty()) return at::ones({int64_t(tensors.size())}, at::TensorOptions(device).dtype(at::kBool));
  int64_t per_tensor = 1;
  const at::Tensor extremes = stacked_extremes(present, device, per_tensor);
  at::Tensor present_finite = at::isfinite(extremes);
  if (per_tensor > 1) present_finite = present_finite.view({-1, per_tensor}).all(1);
  if (present.size() == tensors.size()) return present_finite;
  std::vector<int64_t> where;  // the tensors with values, in order
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].numel() > 0) where.push_back(int64_t(i));
  at::Tensor finite = at::ones({int64_t(tensors.size())}, at::TensorOptions(device).dtype(at::kBool));
  finite.index_put_({at::tensor(where, at::kLong).to(device)}, present_finite);
  return finite;
}

at::Tensor any_nonfinite(const std::vector<at::Tensor>& tensors) {
  const at::TensorOptions flag_options =
      tensors.empty() ? at::TensorOptions(at::kFloat) : tensors.front().options().dtype(at::kFloat);
  if (flag_options.device().is_cpu())
    if (const std::optional<std::vector<bool>> bad = nonfinite_each_on_host(tensors)) {
      bool any = false;
      for (const bool b : *bad) any = any || b;
      at::Tensor flag = at::empty({1}, flag_options);
      *flag.data_ptr<float>() = any ? 1.0f : 0.0f;
      return flag;
    }
  const std::vector<at::Tensor> present = with_values(tensors);
  if (present.empty()) return at::zeros({1}, flag_options);
  int64_t per_tensor = 1;
  const at::Tensor extremes = stacked_extremes(present, present.front().device(), per_tensor);
  return at::logical_not(at::isfinite(extremes).all()).to(at::kFloat).reshape({1});
}

at::Tensor abs_max(const at::Tensor& t) {
  if (const std::optional<float> largest = abs_max_on_host(t)) {
    at::Tensor out = at::empty({}, at::kFloat);
    *out.data_ptr<float>() = *largest;
    return out;
  }
  return t.detach().abs().max().to(at::kFloat);
}

}  // namespace nanscope::probe
