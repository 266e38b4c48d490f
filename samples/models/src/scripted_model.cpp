#include "nanscope/models/scripted_model.hpp"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "nanscope/probe/torchscript_modules.hpp"

namespace nanscope {

namespace {

class ScriptedModel : public TrainableModel {
 public:
  ScriptedModel(torch::jit::Module module, std::string bytes) : module_(std::move(module)), bytes_(std::move(bytes)) {}

  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    c10::IValue out = module_.forward({inputs, targets});
    if (!out.isTensor() || out.toTensor().numel() != 1)
      throw std::invalid_argument("TorchScript forward(inputs, targets) must return a scalar loss");
    return out.toTensor().reshape({});
  }
  NamedTensors all_named_parameters() const override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() const override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void set_training(bool on) override { module_.train(on); }
  ModelSpec spec() const override { return {"torchscript", {}, bytes_}; }
  bool is_torchscript() const override { return true; }

 private:
  mutable torch::jit::Module module_;
  std::string bytes_;
};

// The contract is forward(inputs, targets) -> Tensor: say so, naming the file
// and the signature it has, before any training starts.
void check_forward_signature(const torch::jit::Module& module, const std::string& origin) {
  auto forward = module.find_method("forward");
  if (!forward) throw std::invalid_argument("TorchScript model '" + origin + "' has no forward method");
  const c10::FunctionSchema& schema = forward->function().getSchema();
  size_t required = 0;  // arguments without a default, self excluded
  for (size_t i = 1; i < schema.arguments().size(); ++i)
    if (!schema.arguments()[i].default_value()) ++required;
  const bool takes_two = schema.arguments().size() >= 3 && required <= 2;
  const bool returns_tensor =
      schema.returns().size() == 1 && schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  if (!takes_two || !returns_tensor) {
    std::ostringstream has;
    has << schema;
    throw std::invalid_argument("TorchScript model '" + origin +
                                "': forward must take (inputs, targets) and return the scalar loss as a Tensor; "
                                "it is " +
                                has.str());
  }
}

}  // namespace

std::unique_ptr<TrainableModel> load_scripted_model_bytes(const std::string& bytes, const std::string& origin) {
  // Run the graph as written, op by op: the optimizing executor's fusers hide
  // individual aten ops from op-level capture, and on Debian's LibTorch 2.6 the
  // TensorExpr fuser's LLVM compile stalls the first steps for minutes.
  torch::jit::setGraphExecutorOptimize(false);
  try {
    std::istringstream in(bytes);
    torch::jit::Module module = torch::jit::load(in);
    check_forward_signature(module, origin);
    probe::register_torchscript_modules(module);  // births named by named_modules() paths
    return std::make_unique<ScriptedModel>(std::move(module), bytes);
  } catch (const c10::Error& e) {
    throw std::invalid_argument("cannot load TorchScript model '" + origin + "': " + e.what_without_backtrace());
  }
}

std::unique_ptr<TrainableModel> load_scripted_model(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::invalid_argument("cannot open TorchScript model '" + path + "'");
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return load_scripted_model_bytes(bytes.str(), path);
}

}  // namespace nanscope
