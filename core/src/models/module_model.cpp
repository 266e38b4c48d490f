#include "nanscope/core/module_model.hpp"

#include <stdexcept>

namespace nanscope {

ModuleModel::ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, LossFunction loss,
                         std::map<std::string, int64_t> hparams)
    : NativeModel(std::move(module)), name_(std::move(name)), loss_(std::move(loss)), hparams_(std::move(hparams)) {
  if (name_.empty())
    throw std::invalid_argument("ModuleModel: the model needs a name (replay finds its factory by it)");
}

std::unique_ptr<ModuleModel> ModuleModel::borrowing(std::string name, torch::nn::Module& module, LossFunction loss) {
  std::shared_ptr<torch::nn::Module> unowned(std::shared_ptr<torch::nn::Module>(), &module);  // owns nothing
  return std::make_unique<ModuleModel>(std::move(name), std::move(unowned), std::move(loss));
}

at::Tensor ModuleModel::loss(const Batch& batch) { return batch_loss_ ? batch_loss_(batch) : NativeModel::loss(batch); }

at::Tensor ModuleModel::loss(const at::Tensor& inputs, const at::Tensor& targets) {
  if (batch_loss_) return batch_loss_(Batch(inputs, targets));
  if (!loss_)
    throw std::logic_error("model '" + name_ +
                           "' has no loss function of its own: give ModuleModel one, or replay it with "
                           "nanscope::replay::replay_main(argc, argv, module, loss)");
  return loss_(inputs, targets);
}

}  // namespace nanscope
