#include "nanscope/core/closure_model.hpp"

#include <stdexcept>

namespace nanscope {

ClosureModel::ClosureModel(std::unique_ptr<TrainableModel> body) : body_(std::move(body)) {
  if (!body_) throw std::invalid_argument("ClosureModel: no model");
}

ClosureModel::Step::Step(ClosureModel& model, const LossClosure& closure, const Batch& batch)
    : model_(model), outer_closure_(model.closure_), outer_batch_loss_(model.batch_loss_), outer_batch_(model.batch_) {
  if (!closure) throw std::invalid_argument("StepGuard::step: the loss closure is empty");
  model_.closure_ = &closure;
  model_.batch_loss_ = nullptr;
  model_.batch_ = &batch;
}

ClosureModel::Step::Step(ClosureModel& model, const BatchLoss& loss, const Batch& batch)
    : model_(model), outer_closure_(model.closure_), outer_batch_loss_(model.batch_loss_), outer_batch_(model.batch_) {
  if (!loss) throw std::invalid_argument("StepGuard::step: the loss closure is empty");
  model_.closure_ = nullptr;
  model_.batch_loss_ = &loss;
  model_.batch_ = &batch;
}

ClosureModel::Step::~Step() {
  model_.closure_ = outer_closure_;
  model_.batch_loss_ = outer_batch_loss_;
  model_.batch_ = outer_batch_;
}

namespace {

bool same_batch(const Batch& a, const Batch& b) {
  const std::vector<at::Tensor> x = a.tensors(), y = b.tensors();
  if (x.size() != y.size() || a.structure != b.structure) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!x[i].is_same(y[i])) return false;
  return true;
}

}  // namespace

at::Tensor ClosureModel::loss(const Batch& batch) {
  if (batch_loss_) return (*batch_loss_)(batch);
  if (closure_) {
    if (same_batch(batch, *batch_)) return (*closure_)();
    throw std::logic_error("model '" + spec().name +
                           "': its loss closure runs on the step's own batch only (give StepGuard::step a "
                           "closure that takes the batch, nanscope::BatchLoss, to run another)");
  }
  return body_->loss(batch);
}

}  // namespace nanscope
