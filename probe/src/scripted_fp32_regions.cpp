#include "nanscope/probe/scripted_fp32_regions.hpp"

#include <ATen/record_function.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "module_path.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/probe/float_types.hpp"

namespace nanscope::probe {

namespace {

// RecordFunction callbacks are plain function pointers: the regions are
// global, one set at a time, followed on the thread that set them up.
struct Regions {
  std::vector<std::string> modules;
  std::thread::id thread = std::this_thread::get_id();
  int open = 0;  // listed frames open on the thread
  bool entered = false;
  std::vector<char> entered_module;  // parallel to modules
  at::CallbackHandle handle = 0;
};
Regions* g_regions = nullptr;

// Autocast off for one frame.
struct RegionContext : at::ObserverContext {
  compat::AutocastOff off;
};

// Marks the listed modules that `module` is (or is inside of).
bool listed(Regions& r, const std::string& module) {
  bool any = false;
  for (size_t i = 0; i < r.modules.size(); ++i) {
    const std::string& m = r.modules[i];
    if (m.empty() || module == m || module.rfind(m + ".", 0) == 0) {
      r.entered_module[i] = 1;
      any = true;
    }
  }
  return any;
}

void cast_arguments_up(const at::RecordFunction& fn) {
  for (const c10::IValue& argument : fn.inputs()) {
    if (!argument.isTensor()) continue;
    const at::Tensor& t = argument.toTensor();
    if (t.defined() && is_16bit_float(t.scalar_type()))
      const_cast<c10::IValue&>(argument) = c10::IValue(t.to(at::kFloat));
  }
}

std::unique_ptr<at::ObserverContext> on_frame_enter(const at::RecordFunction& fn) {
  Regions* r = g_regions;
  if (!r || std::this_thread::get_id() != r->thread) return nullptr;
  // A method's frame receives its module as `self`; free functions' frames
  // belong to their caller, already switched or not.
  if (r->open == 0) {
    const auto path = fn.inputs().empty() ? std::nullopt : registered_module_path(fn.inputs()[0]);
    if (!path || !listed(*r, *path)) return nullptr;
  }
  cast_arguments_up(fn);
  ++r->open;
  r->entered = true;
  return std::make_unique<RegionContext>();
}

void on_frame_exit(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx && g_regions) --g_regions->open;  // the context's guards restore autocast as it goes
}

}  // namespace

ScriptedFp32Regions::ScriptedFp32Regions(std::vector<std::string> modules) {
  if (g_regions) throw std::logic_error("only one ScriptedFp32Regions at a time");
  auto regions = std::make_unique<Regions>();
  regions->modules = std::move(modules);
  regions->entered_module.assign(regions->modules.size(), 0);
  regions->handle = at::addGlobalCallback(at::RecordFunctionCallback(on_frame_enter, on_frame_exit)
                                              .needsInputs(true)
                                              .scopes({at::RecordScope::TORCHSCRIPT_FUNCTION}));
  g_regions = regions.release();
}

ScriptedFp32Regions::~ScriptedFp32Regions() {
  at::removeCallback(g_regions->handle);
  delete g_regions;
  g_regions = nullptr;
}

bool ScriptedFp32Regions::entered() const { return g_regions->entered; }

std::vector<std::string> ScriptedFp32Regions::not_entered() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < g_regions->modules.size(); ++i)
    if (!g_regions->entered_module[i]) out.push_back(g_regions->modules[i]);
  return out;
}

}  // namespace nanscope::probe
