#include "nanscope/replay/model_registry.hpp"

#include <map>
#include <mutex>

#include "nanscope/core/module_model.hpp"

namespace nanscope::replay {

namespace {
std::mutex g_mutex;
struct Registered {
  ModelFactory factory;
  StepSetupFactory step_setup;
};
std::map<std::string, Registered>& factories() {
  static std::map<std::string, Registered> f;
  return f;
}
ModelFactory& default_factory() {
  static ModelFactory f;
  return f;
}
}  // namespace

void register_model(const std::string& name, ModelFactory factory, StepSetupFactory step_setup) {
  std::lock_guard<std::mutex> lock(g_mutex);
  factories()[name] = {std::move(factory), std::move(step_setup)};
}

void register_default_model(ModelFactory factory) {
  std::lock_guard<std::mutex> lock(g_mutex);
  default_factory() = std::move(factory);
}

ModelFactory registered_model(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = factories().find(name);
  return it == factories().end() ? ModelFactory{} : it->second.factory;
}

StepSetupFactory registered_step_setup(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = factories().find(name);
  return it == factories().end() ? StepSetupFactory{} : it->second.step_setup;
}

ModelFactory default_model() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return default_factory();
}

std::vector<std::vector<at::Tensor>> parameter_groups(const torch::optim::Optimizer& optimizer) {
  std::vector<std::vector<at::Tensor>> groups;
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) groups.push_back(group.params());
  return groups;
}

int replay_main(int argc, const char* const* argv, torch::nn::Module& module, BatchLoss loss,
                const std::vector<OtherModel>& others, torch::optim::Optimizer* optimizer) {
  register_default_model([&module, loss, others, optimizer](const ModelSpec& spec) -> std::unique_ptr<TrainableModel> {
    // The program's own module: its weights become the snapshot's; its loss
    // takes the batch whole, nested ones as the guard's own re-runs do.
    auto model = ModuleModel::borrowing(spec.name, module);
    model->set_batch_loss(loss);
    for (const OtherModel& other : others) add_other_model(*model, other);
    if (optimizer)
      model->add_optimizer_tensors(optimizer_tensors_outside(parameter_groups(*optimizer), model->named_parameters()));
    return model;
  });
  const int code = replay_main(argc, argv);
  register_default_model(nullptr);  // it refers to `module`
  return code;
}

}  // namespace nanscope::replay
