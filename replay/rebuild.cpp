#include "rebuild.hpp"

#include "nanscope/core/cpu_kernels.hpp"
#include "nanscope/core/remedy.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/utils.h>

#include "nanscope/common/error_text.hpp"
#include "nanscope/common/log_line.hpp"
#include "nanscope/format/advice_words.hpp"
#include "nanscope/probe/float_types.hpp"
#include "nanscope/probe/module_scope.hpp"

#include <algorithm>
#include <iostream>
#include <stdexcept>

#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
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
                              "' is not a built-in model (nanscope-replay registers gpt, mlp and TorchScript): " + how);
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

std::string quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "'" : ", '") + name + "'";
  return out;
}

// The other models the step's loss ran (a GAN's critic): their weights at the
// step go into the models the replay was given under the same labels. A
// snapshot whose loss ran one the replay was not given is refused, naming it:
// run without it, the loss would be another step's.
void load_other_models(TrainableModel& model, const probe::SnapshotContents& s, const std::string& path) {
  const probe::NamedTensorList saved = probe::read_other_modules(path);
  std::vector<std::string> held;
  for (const auto& [name, tensor] : saved)
    if (std::string label = name.substr(0, name.find('.')); std::find(held.begin(), held.end(), label) == held.end())
      held.push_back(label);
  const std::vector<std::string>& given = model.other_model_labels();
  std::vector<std::string> missing;
  for (const std::string& label : held)
    if (std::find(given.begin(), given.end(), label) == given.end()) missing.push_back(label);
  if (!missing.empty()) {
    const std::string how =
        s.origin == format::Origin::python
            ? "nanscope.replay(..., others={'" + missing.front() + "': module})"
            : "nanscope::replay::replay_main(argc, argv, model, loss, {{\"" + missing.front() + "\", module}})";
    throw std::invalid_argument("'" + path + "': the step's loss also ran " + quoted(missing) +
                                ", whose weights at that step the snapshot holds: give " +
                                (missing.size() > 1 ? "them" : "it") + " to the replay under that name, " + how);
  }
  for (const std::string& label : given)
    if (std::find(held.begin(), held.end(), label) == held.end())
      throw std::invalid_argument("'" + path + "': the snapshot holds no other model '" + label +
                                  "' (it holds: " + (held.empty() ? "none" : quoted(held)) + ")");
  load_named(saved, model.other_parameters(), path, "other model's parameter");
  load_named(saved, model.other_buffers(), path, "other model's buffer");
}

// The tensors the step's optimizer stepped outside the model (an optimized
// image, a raw W and b) are part of the step: a replay without them would
// run the replaying program's own values and call a real fault transient.
void refuse_missing_optimizer_tensors(const TrainableModel& model, const probe::SnapshotContents& s,
                                      const std::string& path) {
  std::vector<std::string> missing;
  const NamedTensors held = model.named_parameters();
  for (const auto& [name, tensor] : s.parameters)
    if (name.rfind(kOptimizerTensors, 0) == 0 &&
        std::none_of(held.begin(), held.end(), [&](const auto& h) { return h.first == name; }))
      missing.push_back(name);
  if (missing.empty()) return;
  const std::string how = s.origin == format::Origin::python
                              ? "let the model factory return (model, optimizer), the optimizer built as the loop "
                                "built it: nanscope.replay(snapshot, model=lambda: (model, optimizer), loss=...)"
                              : "give the replay the program's optimizer, built as the loop built it: "
                                "nanscope::replay::replay_main(argc, argv, model, loss, {}, &optimizer)";
  throw std::invalid_argument("'" + path + "': the step's optimizer also stepped " + quoted(missing) +
                              " outside the model, whose values at that step the snapshot holds: " + how);
}

Amp amp_from(format::Precision precision, const std::string& path) {
  if (precision != format::Precision::unknown) return precision;
  throw std::invalid_argument("'" + path + "': unknown precision (a newer nanscope's snapshot?)");
}

}  // namespace

ReplaySetup rebuild(const std::string& path) {
  use_cpu_kernels_from_environment();
  ReplaySetup setup;
  setup.path = path;
  setup.snapshot = probe::read_snapshot(path);
  const probe::SnapshotContents& s = setup.snapshot;
  setup.model = make_model(s, path);
  refuse_missing_optimizer_tensors(*setup.model, s, path);
  load_named(s.parameters, setup.model->named_parameters(), path, "parameter");
  load_named(s.buffers, setup.model->named_buffers(), path, "buffer");
  load_other_models(*setup.model, s, path);
  setup.model->set_training(true);
  register_tensor_owners(*setup.model);  // births named as the training run named them
  setup.parameters = trainable_tensors(*setup.model);
  setup.amp = amp_from(s.precision, path);
  if (StepSetupFactory step_setup = registered_step_setup(s.model_name))
    setup.step_setup = step_setup(*setup.model, s.config, s.step);
  if (auto it = s.config.find("fp32_modules"); it != s.config.end())
    setup.fp32_modules = parse_fp32_modules(it->second);
  if (s.batch.empty()) throw std::invalid_argument("'" + path + "': the snapshot holds no batch");
  // Snapshots are read onto the host; a model built on a GPU runs the batch there.
  if (!setup.parameters.empty()) setup.snapshot.batch = s.batch.to(setup.parameters.front().device());
  return setup;
}

namespace {

// While it lives, every 16-bit floating parameter and buffer of a model (and
// of the other models its loss runs) is float32, the same values; then each
// goes back to its own type, exactly, a gradient a re-run left on it too (a
// re-run leaves the weights as it found them). Its copies are bookkeeping: no
// capture sees them. One that fails (out of memory) puts back what it widened.
class WidenedWeights {
 public:
  explicit WidenedWeights(const TrainableModel& model) {
    const probe::BookkeepingOps bookkeeping;
    c10::NoGradGuard no_grad;
    const NamedTensors parameters = model.all_named_parameters(), buffers = model.named_buffers();
    try {
      for (const NamedTensors* tensors : {&parameters, &buffers, &model.other_parameters(), &model.other_buffers()})
        for (const auto& [name, t] : *tensors)
          if (t.defined() && probe::is_16bit_float(t.scalar_type())) {
            const at::ScalarType own = t.scalar_type();
            at::Tensor(t).set_data(t.to(at::kFloat));  // set_data: the module keeps the same tensor
            widened_.emplace_back(t, own);
          }
    } catch (...) {
      narrow();
      throw;
    }
  }
  ~WidenedWeights() {
    const probe::BookkeepingOps bookkeeping;
    try {
      narrow();
    } catch (const std::exception& e) {  // a destructor must not throw: the replay's weights are not to be trusted
      write_log_line(
          {std::string("nanscope: could not put the widened weights back to 16 bits: ") + e.what(), -1, 0, "", true},
          &std::cerr);
    }
  }
  WidenedWeights(const WidenedWeights&) = delete;
  WidenedWeights& operator=(const WidenedWeights&) = delete;

 private:
  void narrow() {
    c10::NoGradGuard no_grad;
    for (; !widened_.empty(); widened_.pop_back()) {
      auto& [t, type] = widened_.back();
      if (t.grad().defined()) t.mutable_grad() = t.grad().to(type);
      t.set_data(t.to(type));
    }
  }
  std::vector<std::pair<at::Tensor, at::ScalarType>> widened_;
};

}  // namespace

bool step_is_finite_widened(ReplaySetup& setup, Amp amp, const Batch& batch) {
  const WidenedWeights widened(*setup.model);
  Batch wide;
  {
    const probe::BookkeepingOps bookkeeping;
    wide = batch.widened();
  }
  return step_is_finite(setup, amp, wide);
}

bool step_is_finite_in_fp32(ReplaySetup& setup, const Batch& batch) {
  if (setup.model->own_16bit_type_name().empty()) return step_is_finite(setup, Amp::fp32, batch);
  return step_is_finite_widened(setup, Amp::fp32, batch);
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
  MicroBatch micro{batch, CpuRngState::from_bytes(s.cpu_rng_state), 1.0};
  // A watched step's micro-batch, weighted as the loop weighted its loss.
  if (auto it = s.config.find("recorded_loss"); it != s.config.end()) micro.recorded_loss = std::stod(it->second);
  const bool whole = batch.rows() == s.batch.rows();
  if (!whole && !setup.loss_weight && std::isfinite(micro.recorded_loss))
    step_is_finite(setup, amp, s.batch, more_fp32_modules);  // reads the weight on the whole batch first
  if (setup.loss_weight) fix_loss_weight(micro, *setup.loss_weight);
  std::string raised;
  double derived = std::numeric_limits<double>::quiet_NaN();
  const bool finite = rerun_is_finite(*setup.model, setup.parameters, amp, s.loss_scale, setup.step_setup, micro,
                                      fp32_modules, &switchable, &raised, &derived);
  if (whole && !setup.loss_weight) setup.loss_weight = derived;
  setup.last_raised = !raised.empty();
  if (setup.last_raised) setup.rerun_error = raised;
  setup.unswitchable |= !switchable;
  return finite;
}

}  // namespace nanscope::replay
