#pragma once
// Replaying your own native model: a model is rebuilt through a factory
// registered under the name its snapshots carry (ModelSpec::name, the name you
// gave ModuleModel). nanscope-replay registers nanscope-train's built-in
// models and TorchScript files so (replay/main.cpp); a program of a few lines
// does it for yours:
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
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "nanscope/core/closure_model.hpp"
#include "nanscope/core/model.hpp"
#include "nanscope/core/other_model.hpp"
#include "nanscope/core/step_setup.hpp"

namespace nanscope::replay {

using ModelFactory = std::function<std::unique_ptr<TrainableModel>(const ModelSpec& spec)>;
// What every re-run of a snapshot's step repeats around the model's loss, as
// the training harness set that step up (core/step_setup.hpp; nanscope-train
// plants its --fault faults so), made from the snapshot's recorded config
// and step number for the model just built.
using StepSetupFactory =
    std::function<StepSetup(TrainableModel& model, const std::map<std::string, std::string>& config, int64_t step)>;

// Registers (or replaces) the factory for snapshots whose model is `name`
// (TorchScript models' snapshots name "torchscript" and carry the bytes in
// ModelSpec::script_bytes), with what sets up each re-run of its steps.
void register_model(const std::string& name, ModelFactory factory, StepSetupFactory step_setup = {});

// The registered factory for `name`, or an empty function; the same for its step setup.
ModelFactory registered_model(const std::string& name);
StepSetupFactory registered_step_setup(const std::string& name);
ModelFactory default_model();  // register_default_model's, or an empty function

// The factory for snapshots whose model has no factory of its own and is no
// built-in or TorchScript model (the model of a program that trains one).
void register_default_model(ModelFactory factory);

// nanscope-replay's command line and exit codes (0 a verdict, 1 the replay
// failed, 2 bad input), for a program that registered its models first.
// `argv` as main() has it, `char**` or `const char*[]` (pytorch/examples' cpp/dcgan).
int replay_main(int argc, const char* const* argv);

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
//
// `others`: the other models the loss runs (a GAN's critic), under the labels
// the training guard gave them (StepGuard::add_other_model); the snapshot's
// weights for them are loaded first. A snapshot whose loss ran another model
// the replay is not given is refused (exit 2), naming it.
// `optimizer`: the program's optimizer, built as the training loop built it,
// where it steps tensors outside the module (style transfer's image, a raw
// W and b): the snapshot's values for them (named "optimizer.GROUP.INDEX")
// are loaded into its tensors. A snapshot that holds such tensors and a
// replay not given them is refused (exit 2), naming them.
int replay_main(int argc, const char* const* argv, torch::nn::Module& module, BatchLoss loss,
                const std::vector<OtherModel>& others = {}, torch::optim::Optimizer* optimizer = nullptr);

// The groups of `optimizer`'s tensors (each group's params), as
// optimizer_tensors_outside reads them.
std::vector<std::vector<at::Tensor>> parameter_groups(const torch::optim::Optimizer& optimizer);

}  // namespace nanscope::replay
