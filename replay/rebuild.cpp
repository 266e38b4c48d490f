#include "rebuild.hpp"

#include "nanscope/core/cpu_kernels.hpp"
#include "nanscope/core/remedy.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/utils.h>

#include "nanscope/common/error_text.hpp"
#include "nanscope/format/advice_words.hpp"

#include <sstream>
#include <stdexcept>

#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/mlp.hpp"
#include "nanscope/models/scripted_model.hpp"
#include "nanscope/replay/model_registry.hpp"

namespace nanscope::replay {

namespace {

std::unique_ptr<TrainableModel> make_model(const probe::SnapshotContents& s, const std::string& path) {
  ModelSpec spec{s.model_name, s.model_hparams, s.torchscript_bytes};
  if (ModelFactory factory = registered_model(s.model_name)) {
    std::unique_ptr<TrainableModel> model = factory(spec);
    if (!model) throw std::invalid_argument("'" + path + "': the factory for model '" + s.model_name + "' built none");
    return model;
  }
  if (s.model_name == "gpt") return make_gpt(gpt_config_from(spec), 0);
  if (s.model_name == "mlp") return make_mlp(mlp_config_from(spec), 0);
  if (!s.torchscript_bytes.empty()) return load_scripted_model_bytes(s.torchscript_bytes, path);
  if (ModelFactory factory = default_model()) {
    std::unique_ptr<TrainableModel> model = factory(spec);
    if (model) return model;
  }
  // Only the program that trained a model of its own can build it again: say how.
  const std::string how = s.origin == format::Origin::python
                              ? "it was trained from Python: replay it with " + format::replay_command(s, path) +
                                    ", where FACTORY builds the model and LOSS_FN(model, batch) returns the loss"
                              : "replay it from a program that builds the model: your training program given the "
                                "snapshot's path (nanscope::replay::replay_main(argc, argv, model, loss)), or one that "
                                "registers a factory for '" +
                                    s.model_name + "' (nanscope::replay::register_model)";
  throw std::invalid_argument("'" + path + "': model '" + s.model_name +
                              "' is not a built-in model and the snapshot holds no TorchScript: " + how);
}

// The wrappers that put their model under a name of their own: a
// DistributedDataParallel's `module.`, torch.compile's `_orig_mod.`. A snapshot
// of the wrapped model replays into a factory of the plain one, and back.
const char* const kWrapperPrefixes[] = {"module.", "_orig_mod."};

probe::NamedTensorList::const_iterator saved_tensor(const probe::NamedTensorList& saved, const std::string& name) {
  auto named = [&](const std::string& wanted) {
    return std::find_if(saved.begin(), saved.end(), [&](const auto& p) { return p.first == wanted; });
  };
  if (auto it = named(name); it != saved.end()) return it;
  for (const std::string prefix : kWrapperPrefixes) {
    if (auto it = named(prefix + name); it != saved.end()) return it;
    if (name.rfind(prefix, 0) == 0)
      if (auto it = named(name.substr(prefix.size())); it != saved.end()) return it;
  }
  return saved.end();
}

void load_named(const probe::NamedTensorList& saved, const NamedTensors& targets, const std::string& path,
                const char* what) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    auto it = saved_tensor(saved, name);
    if (it == saved.end())
      throw std::invalid_argument("'" + path + "': " + what + " '" + name + "' missing from the snapshot");
    if (it->second.sizes() != target.sizes())
      throw std::invalid_argument("'" + path + "': " + what + " '" + name + "' has the wrong shape");
    at::Tensor t = target;
    t.copy_(it->second);
  }
}

Amp amp_from(format::Precision precision, const std::string& path) {
  if (precision != format::Precision::unknown) return precision;
  throw std::invalid_argument("'" + path + "': unknown precision (a newer nanscope's snapshot?)");
}

Fault fault_at_step(const std::map<std::string, std::string>& config, int64_t step) {
  auto it = config.find("faults");
  if (it == config.end() || it->second.empty()) return {};
  std::vector<Fault> faults;
  std::stringstream list(it->second);
  for (std::string item; std::getline(list, item, ',');) faults.push_back(parse_fault(item));
  return model_fault_at(faults, step);
}

}  // namespace

ReplaySetup rebuild(const std::string& path) {
  use_cpu_kernels_from_environment();
  ReplaySetup setup;
  setup.path = path;
  setup.snapshot = probe::read_snapshot(path);
  const probe::SnapshotContents& s = setup.snapshot;
  setup.model = make_model(s, path);
  load_named(s.parameters, setup.model->named_parameters(), path, "parameter");
  load_named(s.buffers, setup.model->named_buffers(), path, "buffer");
  setup.model->set_training(true);
  register_tensor_owners(*setup.model);  // births named as the training run named them
  setup.parameters = trainable_tensors(*setup.model);
  setup.amp = amp_from(s.precision, path);
  setup.fault = fault_at_step(s.config, s.step);
  if (auto it = s.config.find("fp32_modules"); it != s.config.end())
    setup.fp32_modules = parse_fp32_modules(it->second);
  if (s.batch.empty()) throw std::invalid_argument("'" + path + "': the snapshot holds no batch");
  // Snapshots are read onto the host; a model built on a GPU runs the batch there.
  if (!setup.parameters.empty()) setup.snapshot.batch = s.batch.to(setup.parameters.front().device());
  return setup;
}

bool step_is_finite(ReplaySetup& setup, Amp amp, const Batch& batch,
                    const std::vector<std::string>& more_fp32_modules) {
  const probe::SnapshotContents& s = setup.snapshot;
  std::vector<std::string> fp32_modules = setup.fp32_modules;
  fp32_modules.insert(fp32_modules.end(), more_fp32_modules.begin(), more_fp32_modules.end());
  // An exception ended the step: it did not come out finite. The snapshot
  // exists because the trainer's re-run found a birth before it; the report
  // quotes the error.
  bool switchable = true;
  MicroBatch micro{batch, s.cpu_rng_state, 1.0};
  // A watched step's micro-batch, weighted as the loop weighted its loss.
  if (auto it = s.config.find("recorded_loss"); it != s.config.end()) micro.recorded_loss = std::stod(it->second);
  std::string raised;
  const bool finite = rerun_is_finite(*setup.model, setup.parameters, amp, s.loss_scale,
                                      planting(*setup.model, setup.fault), micro, fp32_modules, &switchable, &raised);
  setup.last_raised = !raised.empty();
  if (setup.last_raised) setup.rerun_error = raised;
  setup.unswitchable |= !switchable;
  return finite;
}

}  // namespace nanscope::replay
