#pragma once
// The model behind a closure step (StepGuard::step(closure, batch)): the
// user's own module, whose forward and loss are the user's code, run by a
// closure the guard calls where it would call a TrainableModel's loss().
//
// The guard runs a step more than once (the forensic re-run, the fallback's
// diagnosis, replay), always on the step's own batch, so a closure that
// captures its batch is enough. A closure that takes the batch (BatchLoss) can
// also run the batch without one of its samples: the search that names the
// sample a data-caused NaN came from.
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nanscope/core/loss_closure.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/probe/batch.hpp"

namespace nanscope {

class ClosureModel final : public TrainableModel {
 public:
  // `body` gives the parameters, buffers, modules and name; its loss() is
  // what runs on a batch when no closure is set (a ModuleModel without a
  // loss function throws, naming the model).
  explicit ClosureModel(std::unique_ptr<TrainableModel> body);

  // While alive, loss() runs this step's closure.
  class Step {
   public:
    Step(ClosureModel& model, const LossClosure& closure, const Batch& batch);
    Step(ClosureModel& model, const BatchLoss& loss, const Batch& batch);
    ~Step();
    Step(const Step&) = delete;
    Step& operator=(const Step&) = delete;

   private:
    ClosureModel& model_;
    // A step inside a step (a search that runs the loss function within a
    // closure step) puts the outer one back.
    const LossClosure* outer_closure_;
    const BatchLoss* outer_batch_loss_;
    const Batch* outer_batch_;
  };

  // The step's closure on its own batch; a BatchLoss on any batch; else the body's loss.
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override { return loss(Batch(inputs, targets)); }
  at::Tensor loss(const Batch& batch) override;
  // Can loss() run on a batch other than the step's (the search for the
  // sample without which a step is finite)?
  bool runs_any_batch() const { return batch_loss_ != nullptr || closure_ == nullptr; }

  NamedTensors all_named_parameters() const override { return body_->all_named_parameters(); }
  NamedTensors own_trainable_parameters() const override { return body_->trainable_parameters(); }
  NamedTensors own_gathered_parameters() override { return body_->gathered_parameters(); }
  NamedTensors parameters_as_stepped() const override { return body_->parameters_as_stepped(); }
  NamedTensors named_buffers() const override { return body_->named_buffers(); }
  std::vector<std::string> module_paths() const override { return body_->module_paths(); }
  void set_training(bool on) override { body_->set_training(on); }
  ModelSpec spec() const override { return body_->spec(); }
  bool is_torchscript() const override { return body_->is_torchscript(); }
  bool scopes_named_by_hooks() const override { return body_->scopes_named_by_hooks(); }
  bool compiled() const override { return body_->compiled(); }
  std::shared_ptr<void> compiled_alone(const std::string& path) override { return body_->compiled_alone(path); }

 private:
  std::unique_ptr<TrainableModel> body_;
  const LossClosure* closure_ = nullptr;
  const BatchLoss* batch_loss_ = nullptr;
  const Batch* batch_ = nullptr;
};

}  // namespace nanscope
