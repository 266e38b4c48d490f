#include "guard/steered.hpp"

#include <stdexcept>

#include <torch/optim/sgd.h>

#include "nanscope/core/closure_optimizer.hpp"
#include "nanscope/core/module_model.hpp"

namespace nanscope {

std::unique_ptr<ClosureModel> Steered::closure_of(GuardedModel& given, const std::string& model_name) {
  if (given.module())  // borrowed: a shared_ptr that owns nothing
    return std::make_unique<ClosureModel>(ModuleModel::borrowing(model_name, *given.module()));
  if (std::unique_ptr<TrainableModel> owned = given.take_owned_model())
    return std::make_unique<ClosureModel>(std::move(owned));
  if (!given.borrowed_model()) throw std::invalid_argument("nanscope::StepGuard: no model (an empty module holder?)");
  return nullptr;
}

TrainableModel& Steered::trained(const std::unique_ptr<ClosureModel>& closure, const GuardedModel& given) {
  return closure ? *closure : *given.borrowed_model();
}

Steered::Steered(GuardedModel given, torch::optim::Optimizer* optimizer, const std::string& model_name)
    : closure(closure_of(given, model_name)),
      stand_in(optimizer ? nullptr
                         : std::make_unique<torch::optim::SGD>(trainable_tensors(trained(closure, given)),
                                                               torch::optim::SGDOptions(0.0))),
      model(trained(closure, given)),
      optimizer(optimizer ? *optimizer : *stand_in),
      applies_update(optimizer != nullptr),
      update_evaluates_closure(evaluates_closure(this->optimizer)) {
  // What the loop's optimizer steps besides the model is the guard's too.
  if (optimizer) {
    std::vector<std::vector<at::Tensor>> groups;
    for (const torch::optim::OptimizerParamGroup& group : optimizer->param_groups()) groups.push_back(group.params());
    NamedTensors held = model.parameters_as_stepped();
    held.insert(held.end(), model.other_parameters().begin(), model.other_parameters().end());
    model.add_optimizer_tensors(optimizer_tensors_outside(groups, held));
  }
}

ClosureModel& Steered::closure_model() {
  if (!closure)
    throw std::logic_error(
        "StepGuard::step(closure, batch): this guard trains a TrainableModel; call step(step, inputs, targets), or "
        "build the guard from your module");
  return *closure;
}

void Steered::run_other_batches_through_loss_fn(std::optional<ClosureModel::Step>& scope, bool watched,
                                                const Batch& batch) {
  if (loss_fn && other_batches_need_loss_fn(watched)) scope.emplace(closure_model(), loss_fn, batch);
}

}  // namespace nanscope
