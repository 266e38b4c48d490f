#include "nanscope/probe/tensor_owners.hpp"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace nanscope::probe {

namespace {

// Weak: a model that is gone keeps nothing alive, and a reused address is told
// apart by the weak pointer.
struct Owner {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  std::string module;
};

std::mutex g_mutex;
std::unordered_map<const c10::TensorImpl*, Owner> g_owners;
std::atomic<bool> g_any{false};

}  // namespace

void register_tensor_owners(const std::vector<std::pair<std::string, at::Tensor>>& named_tensors) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto it = g_owners.begin(); it != g_owners.end();)
    it = it->second.tensor.expired() ? g_owners.erase(it) : std::next(it);
  std::unordered_set<const c10::TensorImpl*>
      named_now;  // a tied tensor keeps its first name, as PyTorch's listing does
  for (const auto& [name, tensor] : named_tensors) {
    if (!tensor.defined() || !named_now.insert(tensor.unsafeGetTensorImpl()).second) continue;
    const size_t dot = name.find_last_of('.');
    const std::string module = dot == std::string::npos ? "" : name.substr(0, dot);
    g_owners.insert_or_assign(
        tensor.unsafeGetTensorImpl(),
        Owner{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(tensor.getIntrusivePtr()), module});
  }
  g_any = !g_owners.empty();
}

bool any_tensor_owners() { return g_any.load(std::memory_order_relaxed); }

std::optional<std::string> tensor_owner(const at::Tensor& t) {
  if (!t.defined()) return std::nullopt;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_owners.find(impl);
  if (it == g_owners.end() || it->second.tensor.expired()) return std::nullopt;
  return it->second.module;
}

std::string common_module(const std::string& a, const std::string& b) {
  // Compare whole dotted parts: "fc1" and "fc10" share nothing.
  size_t common = 0;
  for (size_t i = 0;; ++i) {
    const bool end_a = i == a.size() || a[i] == '.', end_b = i == b.size() || b[i] == '.';
    if (end_a && end_b) common = i;
    if (i == a.size() || i == b.size() || a[i] != b[i]) break;
  }
  return a.substr(0, common);
}

}  // namespace nanscope::probe
