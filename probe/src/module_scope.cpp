#include "nanscope/probe/module_scope.hpp"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "nanscope/common/torch_compat.hpp"
#include "nanscope/probe/kernel_pin.hpp"

namespace nanscope::probe {

namespace detail {

std::atomic<bool> g_scopes_enabled{false};

namespace {
// Full dotted paths, innermost last. Autograd worker threads have their own
// (empty) stack: backward ops are attributed through seqNr instead.
thread_local std::vector<std::string> t_scopes;

using compat::AutocastOff;
const std::vector<std::string>* g_fp32_modules = nullptr;
std::vector<char>* g_fp32_entered = nullptr;                            // parallel to *g_fp32_modules
thread_local std::vector<std::unique_ptr<AutocastOff>> t_fp32_regions;  // parallel to t_scopes
const std::vector<KernelRegion>* g_kernel_regions = nullptr;
thread_local std::vector<std::unique_ptr<KernelPin>> t_kernel_pins;  // parallel to t_scopes
std::mutex g_names_mutex;
std::vector<std::string>* g_scope_names = nullptr;  // a ScopeNameRecorder's
}  // namespace

void (*g_scope_listener)() = nullptr;

void push_scope(const char* name) {
  push_scope_path(t_scopes.empty() || t_scopes.back().empty() ? std::string(name) : t_scopes.back() + "." + name);
}

bool push_scope_path(const std::string& path) {
  if (g_scope_listener) g_scope_listener();
  t_scopes.push_back(path);
  if (g_scope_names) {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    if (g_scope_names &&
        std::find(g_scope_names->begin(), g_scope_names->end(), t_scopes.back()) == g_scope_names->end())
      g_scope_names->push_back(t_scopes.back());
  }
  bool fp32 = false;
  if (g_fp32_modules) {
    const auto it = std::find(g_fp32_modules->begin(), g_fp32_modules->end(), t_scopes.back());
    if (it != g_fp32_modules->end()) {
      fp32 = true;
      (*g_fp32_entered)[size_t(it - g_fp32_modules->begin())] = 1;
    }
  }
  t_fp32_regions.push_back(fp32 ? std::make_unique<AutocastOff>() : nullptr);
  std::unique_ptr<KernelPin> pin;
  if (g_kernel_regions)
    for (const KernelRegion& region : *g_kernel_regions)
      if (region.module == t_scopes.back()) pin = std::make_unique<KernelPin>(region.kernel);
  t_kernel_pins.push_back(std::move(pin));
  return fp32;
}

void pop_scope() {
  if (g_scope_listener) g_scope_listener();
  if (!t_kernel_pins.empty()) t_kernel_pins.pop_back();
  if (!t_fp32_regions.empty()) t_fp32_regions.pop_back();
  if (!t_scopes.empty()) t_scopes.pop_back();
}

}  // namespace detail

Fp32Regions::Fp32Regions(std::vector<std::string> modules)
    : modules_(std::move(modules)),
      entered_(modules_.size(), 0),
      scopes_were_enabled_(detail::g_scopes_enabled.load()) {
  detail::g_fp32_modules = &modules_;
  detail::g_fp32_entered = &entered_;
  detail::g_scopes_enabled = true;
}

Fp32Regions::~Fp32Regions() {
  detail::g_fp32_modules = nullptr;
  detail::g_fp32_entered = nullptr;
  detail::g_scopes_enabled = scopes_were_enabled_;
}

std::vector<std::string> Fp32Regions::not_entered() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < modules_.size(); ++i)
    if (!entered_[i]) out.push_back(modules_[i]);
  return out;
}

KernelRegions::KernelRegions(std::vector<KernelRegion> regions)
    : regions_(std::move(regions)),
      outer_(detail::g_kernel_regions),
      scopes_were_enabled_(detail::g_scopes_enabled.load()) {
  detail::g_kernel_regions = &regions_;
  detail::g_scopes_enabled = true;
}

KernelRegions::~KernelRegions() {
  detail::g_kernel_regions = outer_;
  detail::g_scopes_enabled = scopes_were_enabled_;
}

ScopeNameRecorder::ScopeNameRecorder() : scopes_were_enabled_(detail::g_scopes_enabled.load()) {
  std::lock_guard<std::mutex> lock(detail::g_names_mutex);
  detail::g_scope_names = &names_;
  detail::g_scopes_enabled = true;
}

ScopeNameRecorder::~ScopeNameRecorder() {
  std::lock_guard<std::mutex> lock(detail::g_names_mutex);
  detail::g_scope_names = nullptr;
  detail::g_scopes_enabled = scopes_were_enabled_;
}

std::vector<std::string> ScopeNameRecorder::names() const {
  std::lock_guard<std::mutex> lock(detail::g_names_mutex);
  return names_;
}

namespace {
thread_local std::optional<format::Phase> t_phase;
thread_local int t_bookkeeping = 0;
}  // namespace

BookkeepingOps::BookkeepingOps() { ++t_bookkeeping; }
BookkeepingOps::~BookkeepingOps() { --t_bookkeeping; }
bool inside_bookkeeping_ops() { return t_bookkeeping > 0; }

PhaseScope::PhaseScope(format::Phase phase) : previous_(t_phase) { t_phase = phase; }
PhaseScope::~PhaseScope() { t_phase = previous_; }
std::optional<format::Phase> current_phase_override() { return t_phase; }

const std::string& current_module_scope() {
  static const std::string root;
  return detail::t_scopes.empty() ? root : detail::t_scopes.back();
}

bool inside_module_scope() { return !detail::t_scopes.empty(); }

size_t module_scope_depth() { return detail::t_scopes.size(); }

}  // namespace nanscope::probe
