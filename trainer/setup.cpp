#include "nanscope/trainer/setup.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "nanscope/common/blas_threads.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/core/checkpoint.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/models/fault_host.hpp"
#include "nanscope/models/gpt.hpp"
#include "nanscope/models/mlp.hpp"
#include "nanscope/models/scripted_model.hpp"

namespace nanscope::trainer {

namespace {

bool is_builtin(const std::string& model) { return model == "mlp" || model == "gpt"; }

// Intra-op threads: --threads, else with several ranks on this machine its
// cores shared between them (torchrun's LOCAL_WORLD_SIZE, else the world size),
// else LibTorch's default.
int intra_op_threads(const TrainOptions& o) {
  if (o.threads > 0) return o.threads;
  if (!o.dist.enabled()) return 0;
  int local_ranks = o.dist.world_size;
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) local_ranks = std::max(1, std::atoi(local));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local_ranks);
}

}  // namespace

at::Device select_device(DeviceChoice requested) {
  const bool has_cuda = torch::cuda::is_available();
  if (requested == DeviceChoice::cuda && !has_cuda)
    throw std::invalid_argument("--device cuda: no CUDA device (or this LibTorch has no CUDA)");
  const bool cuda = requested == DeviceChoice::cuda || (requested == DeviceChoice::automatic && has_cuda);
  return cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
}

void configure_runtime(const TrainOptions& o, at::Device device) {
  keep_blas_single_threaded();
  if (const int threads = intra_op_threads(o); threads > 0) at::set_num_threads(threads);
  torch::manual_seed(o.seed);
  if (device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(o.tf32);
    at::globalContext().setAllowTF32CuDNN(o.tf32);
    at::globalContext().setBenchmarkCuDNN(!o.deterministic);
  }
  if (o.deterministic) {
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
}

Dataset make_dataset(const TrainOptions& o) {
  if (!o.data.empty()) return load_dataset(o.data);
  if (o.model == "gpt") return builtin_text_dataset(o.seq_len);
  if (o.model == "mlp") return builtin_teacher_dataset(4096, 32, 8, /*seed=*/1234);
  throw std::invalid_argument("a TorchScript model needs --data PATH.h5");
}

std::unique_ptr<TrainableModel> make_model(const TrainOptions& o, const Dataset& data) {
  if (o.model == "gpt") {
    GptConfig c;
    c.n_layer = o.n_layer;
    c.n_head = o.n_head;
    c.n_embd = o.n_embd;
    c.seq_len = data.inputs.dim() == 2 ? data.inputs.size(1) : o.seq_len;
    c.vocab_size = std::max<int64_t>(256, data.targets.max().item<int64_t>() + 1);
    return make_gpt(c, o.seed);
  }
  if (o.model == "mlp") {
    if (data.inputs.dim() != 2 || !at::isFloatingType(data.inputs.scalar_type()))
      throw std::invalid_argument("mlp needs float /inputs of shape [samples, features] in " + data.source);
    if (data.targets.dim() != 1 || at::isFloatingType(data.targets.scalar_type()))
      throw std::invalid_argument("mlp needs integer class /targets of shape [samples] in " + data.source);
    MlpConfig c;
    c.in_features = data.inputs.size(1);
    c.hidden = o.hidden;
    c.classes = std::max<int64_t>(2, data.targets.max().item<int64_t>() + 1);
    return make_mlp(c, o.seed);
  }
  return load_scripted_model(o.model);
}

namespace {

// One forward of a TorchScript model on the data's first rows, before any
// training: a loss that is no scalar is bad input named in one line, not a
// failure at step 0. A forward that raises is left to the step, where an op
// raising on a NaN is a non-finite step and anything else fails the run.
// Leaves the model, its mode and the RNG as they were.
void check_loss_is_a_scalar(const std::string& path, TrainableModel& model, const Dataset& data) {
  const int64_t rows = std::min<int64_t>(2, data.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = generator.get_state();
  torch::NoGradGuard no_grad;
  model.set_training(false);
  std::string not_scalar;
  try {
    model.loss(data.inputs.slice(0, 0, rows), data.targets.slice(0, 0, rows));
  } catch (const std::invalid_argument& e) {
    not_scalar = e.what();
  } catch (const std::exception&) {}
  model.set_training(true);
  generator.set_state(rng);
  if (!not_scalar.empty()) throw std::invalid_argument("'" + path + "': " + not_scalar);
}

}  // namespace

void check_compatibility(const TrainOptions& o, TrainableModel& model, const Dataset& data, at::Device device) {
  if (o.amp != Amp::fp32 && !compat::autocast_supported(device.type(), autocast_dtype(o.amp)))
    throw std::invalid_argument(std::string("--amp ") + amp_name(o.amp) + " is not available on " + device.str() +
                                " with LibTorch " + TORCH_VERSION + " (LibTorch 1.13 autocasts to bf16 only on CPU)");
  for (const auto& f : o.faults) {
    if (f.kind == FaultKind::corrupt_sample && (f.arg < 0 || f.arg >= double(data.size())))
      throw std::invalid_argument("--fault corrupt_sample row must be a row of the data set (0.." +
                                  std::to_string(data.size() - 1) + ")");
    if ((f.kind == FaultKind::nonfinite_input || f.kind == FaultKind::corrupt_sample) &&
        !at::isFloatingType(data.inputs.scalar_type()))
      throw std::invalid_argument(std::string("--fault ") + fault_name(f.kind) + " needs float inputs; " + data.source +
                                  " holds " + c10::toString(data.inputs.scalar_type()) +
                                  " (use the mlp or a model with float inputs)");
    if (f.kind == FaultKind::nonfinite_input && (f.arg < 0 || f.arg >= o.batch_size))
      throw std::invalid_argument("--fault nonfinite_input row must be within the batch (0.." +
                                  std::to_string(o.batch_size - 1) + ")");
    if ((f.kind == FaultKind::input_ramp || f.kind == FaultKind::sample_burst) &&
        !at::isFloatingType(data.inputs.scalar_type()))
      throw std::invalid_argument(std::string("--fault ") + fault_name(f.kind) + " needs float inputs; " + data.source +
                                  " holds " + c10::toString(data.inputs.scalar_type()));
    if (!is_loop_fault(f.kind)) {
      if (!plant_fault(model, f))
        throw std::invalid_argument(std::string("--fault ") + fault_name(f.kind) + " cannot be planted in " + o.model +
                                    " (TorchScript models host only nonfinite_input, lr_spike, lr_pulse, lr_ramp, "
                                    "input_ramp and sample_burst; masked_row needs the gpt's attention)");
      plant_fault(model, {FaultKind::none});
    }
  }
  if (!is_builtin(o.model)) check_loss_is_a_scalar(o.model, model, data);
  if (!is_builtin(o.model) && o.z_loss > 0)
    throw std::invalid_argument("--z-loss needs a built-in model: a TorchScript model returns its own loss");
}

std::unique_ptr<TrainableModel> prepared_model(const TrainOptions& o, const Dataset& data, at::Device device,
                                               std::ostream& log) {
  std::unique_ptr<TrainableModel> model = make_model(o, data);
  if (!o.init.empty()) {
    const int64_t from = load_checkpoint(o.init, *model);
    log << "init: " << o.init << " (saved at step " << from << ")\n";
  }
  check_compatibility(o, *model, data, device);
  model->to(device, at::kFloat);
  model->set_training(true);
  model->set_z_loss(o.z_loss);
  return model;
}

std::pair<at::Tensor, at::Tensor> planted_batch(const Dataset& data, const std::vector<Fault>& faults, int64_t step,
                                                const at::Tensor& rows, at::Device device) {
  at::Tensor inputs = data.inputs.index_select(0, rows);
  if (auto row = poisoned_row_at(faults, step)) inputs[*row].fill_(std::nan(""));
  for (int64_t corrupt : corrupt_rows_at(faults, step)) {
    const at::Tensor at_rows = (rows == corrupt).nonzero().flatten();
    if (at_rows.numel() > 0) inputs.index_fill_(0, at_rows, std::nan(""));
  }
  if (const double scale = input_scale_at(faults, step); scale != 1.0 && inputs.is_floating_point())
    inputs = inputs * scale;
  at::Tensor targets = data.targets.index_select(0, rows);
  if (const double scale = target_scale_at(faults, step); scale != 1.0 && targets.is_floating_point())
    targets = targets * scale;
  return {inputs.to(device), targets.to(device)};
}

}  // namespace nanscope::trainer
