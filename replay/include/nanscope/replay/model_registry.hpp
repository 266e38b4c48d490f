#pragma once
// Replaying your own native model: nanscope-replay rebuilds the built-in models
// and TorchScript files by itself; a model of yours it rebuilds through a
// factory you register under the name its snapshots carry (ModelSpec::name, the
// name you gave ModuleModel). A program of a few lines does it:
//
//   int main(int argc, char** argv) {
//     nanscope::replay::register_model("my_net", [](const nanscope::ModelSpec&) {
//       auto net = std::make_shared<Net>();
//       return std::make_unique<nanscope::ModuleModel>("my_net", net, loss_fn_for(net));
//     });
//     return nanscope::replay::replay_main(argc, argv);  // nanscope-replay's command line
//   }
//
// The factory builds the model with any weights; replay loads the snapshot's
// parameters and buffers into it by name, then runs the same verdicts.
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

#include "nanscope/core/closure_model.hpp"
#include "nanscope/core/model.hpp"

namespace nanscope::replay {

using ModelFactory = std::function<std::unique_ptr<TrainableModel>(const ModelSpec& spec)>;

// Registers (or replaces) the factory for snapshots whose model is `name`.
void register_model(const std::string& name, ModelFactory factory);

// The registered factory for `name`, or an empty function.
ModelFactory registered_model(const std::string& name);
ModelFactory default_model();  // register_default_model's, or an empty function

// The factory for snapshots whose model has no factory of its own and is no
// built-in or TorchScript model (the model of a program that trains one).
void register_default_model(ModelFactory factory);

// nanscope-replay's command line and exit codes (0 a verdict, 1 the replay
// failed, 2 bad input), for a program that registered its models first.
int replay_main(int argc, char** argv);

// The same from the training program itself, for its own model: `module` (its
// weights are replaced by the snapshot's) and `loss`, the step's forward and
// loss on a batch. No second program, no model header to share:
//
//   int main(int argc, char** argv) {
//     Net model;
//     if (argc > 1) return nanscope::replay::replay_main(argc, argv, model, [&](const nanscope::Batch& b) {
//       return torch::nll_loss(model.forward(b.inputs), b.targets);
//     });
//     ...
int replay_main(int argc, char** argv, torch::nn::Module& module, BatchLoss loss);

}  // namespace nanscope::replay
