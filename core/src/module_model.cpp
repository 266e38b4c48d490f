#include "nanscope/core/module_model.hpp"

#include <stdexcept>

namespace nanscope {

ModuleModel::ModuleModel(std::string name, std::shared_ptr<torch::nn::Module> module, LossFunction loss,
                         std::map<std::string, int64_t> hparams)
    : NativeModel(std::move(module)), name_(std::move(name)), loss_(std::move(loss)), hparams_(std::move(hparams)) {
  if (name_.empty())
    throw std::invalid_argument("ModuleModel: the model needs a name (replay finds its factory by it)");
  if (!loss_) throw std::invalid_argument("ModuleModel '" + name_ + "': no loss function");
}

}  // namespace nanscope
