// nanscope-replay: the command line of replay/cli.cpp, with nanscope-train's
// models (the built-in gpt and mlp, and TorchScript files) registered as any
// program registers its own (model_registry.hpp). Each re-run of a step plants
// the --fault fault the training run planted at that step.
#include <sstream>
#include <string>
#include <vector>

#include "nanscope/models/fault.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/mlp.hpp"
#include "nanscope/models/scripted_model.hpp"
#include "nanscope/replay/model_registry.hpp"

namespace {

// The fault the run's --fault list (recorded in its config) planted at `step`.
nanscope::StepSetup planted_fault(nanscope::TrainableModel& model, const std::map<std::string, std::string>& config,
                                  int64_t step) {
  auto it = config.find("faults");
  if (it == config.end() || it->second.empty()) return {};
  std::vector<nanscope::Fault> faults;
  std::stringstream list(it->second);
  for (std::string item; std::getline(list, item, ',');) faults.push_back(nanscope::parse_fault(item));
  return nanscope::planting(model, nanscope::model_fault_at(faults, step));
}

}  // namespace

int main(int argc, char** argv) {
  using nanscope::ModelSpec;
  namespace replay = nanscope::replay;
  replay::register_model(
      "gpt", [](const ModelSpec& spec) { return nanscope::make_gpt(nanscope::gpt_config_from(spec), 0); },
      planted_fault);
  replay::register_model(
      "mlp", [](const ModelSpec& spec) { return nanscope::make_mlp(nanscope::mlp_config_from(spec), 0); },
      planted_fault);
  replay::register_model(
      "torchscript",
      [](const ModelSpec& spec) { return nanscope::load_scripted_model_bytes(spec.script_bytes, "the snapshot"); },
      planted_fault);
  return replay::replay_main(argc, argv);
}
