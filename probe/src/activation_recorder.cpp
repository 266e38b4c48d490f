#include "nanscope/probe/activation_recorder.hpp"

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/jit/runtime/interpreter.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "module_path.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "op_arguments.hpp"
#include "tensor_stats.hpp"

namespace nanscope::probe {

namespace {

struct RecorderState {
  std::mutex mutex;
  std::unordered_map<std::string, size_t> layer_of;
  std::vector<at::Tensor> absmax;  // per layer, on the device; undefined until an op ran there
};

RecorderState* g_recorder = nullptr;
at::CallbackHandle g_recorder_handle = 0;
bool g_recorder_scopes_were_enabled = false;
thread_local bool t_recording = false;

void record_absmax_on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_recording || !g_recorder || fn.scope() != at::RecordScope::FUNCTION) return;
  if (makes_no_new_values(fn.name())) return;
  std::string module = current_module_scope();
  if (module.empty()) module = dotted_module_path(torch::jit::currentModuleHierarchy());
  auto it = g_recorder->layer_of.find(module);
  if (it == g_recorder->layer_of.end()) return;
  t_recording = true;
  at::NoGradGuard no_grad;
  for (const c10::IValue& out : op_results(fn, op_arity(fn))) {
    if (!out.isTensor() || !is_floating(out.toTensor()) || out.toTensor().numel() == 0) continue;
    at::Tensor m = out.toTensor().detach().abs().max().to(at::kFloat);
    std::lock_guard<std::mutex> lock(g_recorder->mutex);
    at::Tensor& slot = g_recorder->absmax[it->second];
    slot = slot.defined() ? at::maximum(slot, m) : m;
    break;  // the op's result; further outputs are statistics (a norm's mean and rstd)
  }
  t_recording = false;
}

std::unique_ptr<at::ObserverContext> record_absmax_on_op_start(const at::RecordFunction&) { return nullptr; }

}  // namespace

ActivationRecorder::ActivationRecorder(const std::vector<std::string>& layer_names) {
  if (g_recorder) throw std::logic_error("only one ActivationRecorder may be active at a time");
  g_recorder = new RecorderState();
  for (size_t i = 0; i < layer_names.size(); ++i) g_recorder->layer_of[layer_names[i]] = i;
  g_recorder->absmax.resize(layer_names.size());
  g_recorder_scopes_were_enabled = detail::g_scopes_enabled;
  detail::g_scopes_enabled = true;
  // Forward only: activations are what the forward produces.
  g_recorder_handle =
      at::addGlobalCallback(at::RecordFunctionCallback(record_absmax_on_op_start, record_absmax_on_op_end)
                                .needsOutputs(true)
                                .scopes({at::RecordScope::FUNCTION}));
}

ActivationRecorder::~ActivationRecorder() {
  at::removeCallback(g_recorder_handle);
  detail::g_scopes_enabled = g_recorder_scopes_were_enabled;
  delete g_recorder;
  g_recorder = nullptr;
}

std::vector<float> ActivationRecorder::result() const {
  std::lock_guard<std::mutex> lock(g_recorder->mutex);
  const auto& absmax = g_recorder->absmax;
  std::vector<float> out(absmax.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<at::Tensor> present;
  std::vector<size_t> where;
  for (size_t i = 0; i < absmax.size(); ++i)
    if (absmax[i].defined()) {
      present.push_back(absmax[i].to(at::kCPU));
      where.push_back(i);
    }
  if (present.empty()) return out;
  at::Tensor host = at::stack(present);  // one copy per device tensor above, one stack here
  const float* v = host.data_ptr<float>();
  for (size_t k = 0; k < where.size(); ++k) out[where[k]] = v[k];
  return out;
}

double headroom_bits(double absmax, double limit) {
  if (!(absmax > 0)) return std::numeric_limits<double>::infinity();
  return std::log2(limit / absmax);
}

}  // namespace nanscope::probe
