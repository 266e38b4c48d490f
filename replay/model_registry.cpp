#include "nanscope/replay/model_registry.hpp"

#include <map>
#include <mutex>

#include "nanscope/core/module_model.hpp"

namespace nanscope::replay {

namespace {
std::mutex g_mutex;
std::map<std::string, ModelFactory>& factories() {
  static std::map<std::string, ModelFactory> f;
  return f;
}
ModelFactory& default_factory() {
  static ModelFactory f;
  return f;
}
}  // namespace

void register_model(const std::string& name, ModelFactory factory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  factories()[name] = std::move(factory);
}

void register_default_model(ModelFactory factory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  default_factory() = std::move(factory);
}

ModelFactory registered_model(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = factories().find(name);
  return it == factories().end() ? ModelFactory{} : it->second;
}

ModelFactory default_model() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return default_factory();
}

int replay_main(int argc, char** argv, torch::nn::Module& module, BatchLoss loss) {
  register_default_model([&module, loss](const ModelSpec& spec) -> std::unique_ptr<TrainableModel> {
    // The program's own module: its weights become the snapshot's; its loss
    // takes the batch whole, nested ones as the guard's own re-runs do.
    auto model = ModuleModel::borrowing(spec.name, module);
    model->set_batch_loss(loss);
    return model;
  });
  const int code = replay_main(argc, argv);
  register_default_model(nullptr);  // it refers to `module`
  return code;
}

}  // namespace nanscope::replay
