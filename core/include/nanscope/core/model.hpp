#pragma once
// What the training loop needs from a model, whether it is a built-in C++
// module (mlp, gpt) or a TorchScript file. Contract (README, Models):
// loss(inputs, targets) returns a scalar loss.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nanscope/probe/batch.hpp"

namespace nanscope {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Enough to rebuild the model elsewhere: a built-in's name and
// hyperparameters, or a TorchScript file's bytes.
struct ModelSpec {
  std::string name;                        // "mlp", "gpt" or "torchscript"
  std::map<std::string, int64_t> hparams;  // empty for TorchScript
  std::string script_bytes;                // TorchScript only
};

// Sets `out` from spec.hparams[key] when the spec has it (a built-in's
// sizes, read back by replay and --init); leaves the default otherwise.
void read_hparam(const ModelSpec& spec, const char* key, int64_t& out);

class TrainableModel {
 public:
  virtual ~TrainableModel() = default;
  virtual at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;
  // The loss of any batch: a nested one needs a model that knows its
  // structure (the Python module's); the rest take (inputs, targets).
  virtual at::Tensor loss(const Batch& batch);
  // Each parameter once, under the first name the model gives it: a tensor
  // shared by two names (an embedding tied to the output head, as in GPT-2) is
  // one parameter to the optimizer, the grad norms, clipping, the per-layer
  // norms (it counts under its first name's module), checkpoints, snapshots
  // and the gradient buckets, as it is in PyTorch's parameters().
  // Then the optimizer's tensors outside the model (add_optimizer_tensors).
  NamedTensors named_parameters() const;
  // A sharded model's parameters are this process's shards of them; these
  // are the whole ones, gathered from every rank (a collective: every rank
  // calls it at once), as a snapshot holds them; then the optimizer's
  // tensors outside the model. Else named_parameters().
  NamedTensors gathered_parameters();
  // The model's own part of each (what a subclass gives).
  virtual NamedTensors own_gathered_parameters() { return own_named_parameters(); }
  NamedTensors own_named_parameters() const;
  // Every (dotted name, tensor) pair the model holds, a shared tensor under each of its names.
  virtual NamedTensors all_named_parameters() const = 0;
  virtual NamedTensors named_buffers() const = 0;
  // Every module's dotted path as named_modules() gives it, the root as "":
  // what a module scope's name is checked against. By default, the owners of
  // the parameters and buffers and their ancestors.
  virtual std::vector<std::string> module_paths() const;
  // Moves every parameter and buffer to `device` and casts the floating ones
  // to `float_type`, as PyTorch's Module.to(dtype) does: integer and bool
  // buffers (position ids, BatchNorm's num_batches_tracked, masks) keep their type.
  void to(at::Device device, at::ScalarType float_type);
  // The fallback's full precision: 16-bit floating parameters and buffers
  // (a model trained in bf16 or fp16 itself) widen to float32; float32 and
  // float64 ones stay: no fallback narrows a model's own precision.
  void widen_to_fp32();
  // The model's own floating type: its first floating parameter's (float32
  // for a model without one).
  at::ScalarType own_float_type() const;
  // Its name as PyTorch spells the dtype: "float64", "bfloat16", "float16", "float32".
  std::string own_float_type_name() const;
  // "bfloat16" or "float16" for a model whose own weights are 16-bit (a
  // fine-tune loaded so), "" for wider ones. Such a model computes in them
  // with autocast off too: no re-run with autocast off is an fp32 one, and
  // no fallback widens it (FallbackPolicy).
  std::string own_16bit_type_name() const;
  virtual void set_training(bool on) = 0;
  virtual ModelSpec spec() const = 0;
  // A TorchScript model: its modules are interpreter frames, not C++ scopes
  // (what switching a module to fp32 needs to know).
  virtual bool is_torchscript() const { return false; }
  // Its module scopes are opened by hooks that take each name from
  // named_modules() (the Python module's): no scope name can be misspelt, so
  // the first step's check of them is skipped (it would make the step listen,
  // and a compiled model run eagerly).
  virtual bool scopes_named_by_hooks() const { return false; }
  // A model whose steps run a compiled program (torch.compile). Op-level
  // capture runs it eagerly, op by op (what a birth's op and module need), so
  // a step that the eager re-run found finite is run compiled too, capture
  // off: non-finite there is the compiler's doing (core/compiled_region.hpp).
  virtual bool compiled() const { return false; }
  // While the returned handle lives, the model's steps run eagerly but for
  // the module at `path` (named_modules()'s), which runs compiled as the
  // user's program compiles it. Null when the model cannot (not compiled).
  virtual std::shared_ptr<void> compiled_alone(const std::string& /*path*/) { return nullptr; }
  // Auxiliary z-loss coefficient (P15); models without logits ignore it.
  virtual void set_z_loss(double /*coefficient*/) {}

  int64_t parameter_count() const;
  // named_parameters() that require a gradient: what the optimizer, the
  // grad norms and the probe's layer table see, in this order.
  NamedTensors trainable_parameters() const;
  // The model's own: a sharded model's shards say it themselves (they hold no gradient of their own).
  virtual NamedTensors own_trainable_parameters() const;

  // Tensors the optimizer steps that the model does not hold: an image style
  // transfer optimizes, a prompt, a temperature kept beside the model, a
  // raw-tensor program's W and b. They are the guard's as the model's own
  // parameters are (gradients cleared and checked, the skip, rollback states,
  // health, checkpoints, snapshots), named kOptimizerTensors + "GROUP.INDEX"
  // (optimizer_tensors_outside). Ops on them are named as the root module's.
  void add_optimizer_tensors(const NamedTensors& tensors);
  // The model's parameters as its optimizer holds them: what tells the
  // optimizer's tensors outside it from its own. A sharded model's optimizer
  // holds the sharded parameters, not the local shards the guard steers.
  virtual NamedTensors parameters_as_stepped() const { return own_named_parameters(); }
  const NamedTensors& optimizer_tensors() const { return optimizer_tensors_; }

  // Another model this one's loss also runs (a GAN's critic in the
  // generator's loss), its tensors named "LABEL.name": a re-run puts its
  // buffers back (a re-run is no step of its), births in it are named outside
  // this model, snapshots keep its weights and replay loads them. Throws
  // std::invalid_argument for an empty or repeated label.
  void add_other_model(const std::string& label, const NamedTensors& parameters, const NamedTensors& buffers);
  const NamedTensors& other_parameters() const { return other_parameters_; }
  const NamedTensors& other_buffers() const { return other_buffers_; }
  const std::vector<std::string>& other_model_labels() const { return other_labels_; }

 private:
  std::vector<std::string> other_labels_;
  NamedTensors other_parameters_, other_buffers_;
  NamedTensors optimizer_tensors_;
};

// The prefix of the optimizer's tensors outside the model: "optimizer.0.1" is
// param_groups[0]["params"][1].
inline constexpr const char* kOptimizerTensors = "optimizer.";

// The tensors of `groups` (each group's params, in order) that are none of
// `held`, named kOptimizerTensors + "GROUP.INDEX".
NamedTensors optimizer_tensors_outside(const std::vector<std::vector<at::Tensor>>& groups, const NamedTensors& held);

// How births name a module of another model: OUTSIDE_THE_MODEL + "LABEL.path".
inline constexpr const char* kOutsideTheModel = "<not in the model> ";

// Lets op-level capture name the module of an op by the parameters and
// buffers it reads (probe/tensor_owners.hpp), for a model without module
// scopes; a TorchScript model names its own modules and is left alone. Its
// other models' tensors are named outside it. Ownership is process-wide, so
// with two guards (a GAN's) each registers again before it captures.
void register_tensor_owners(const TrainableModel& model);

// The tensors of model.trainable_parameters(); throws std::invalid_argument
// for a model that has none.
std::vector<at::Tensor> trainable_tensors(const TrainableModel& model);

}  // namespace nanscope
