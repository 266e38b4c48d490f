// StepGuard's construction and its own state (what a checkpoint keeps of it).
#include "guard/step_guard_impl.hpp"

#include <algorithm>
#include <filesystem>

#include "nanscope/common/number_text.hpp"
#include "nanscope/core/cpu_kernels.hpp"
#include "nanscope/core/fallback.hpp"
#include "nanscope/core/guard_option_list.hpp"
#include "nanscope/format/run_layout.hpp"

namespace nanscope {

namespace {

std::vector<std::string> trainable_names(const TrainableModel& model) {
  std::vector<std::string> out;
  for (const auto& [name, p] : model.trainable_parameters()) out.push_back(name);
  return out;
}

// Options checked before any member is built from them (a memory budget of
// inf would overflow a size_t), each refused one named as its author spells it.
GuardOptions checked(GuardOptions o) {
  check_guard_options(o, spelling_of(o.origin));
  return o;
}

probe::ProbeOptions probe_options(const GuardOptions& o) {
  probe::ProbeOptions p;
  p.run_dir = o.run_dir;
  p.rank = o.rank;
  p.world_size = o.world_size;
  return p;
}

LossScalerConfig scaler_config(Amp amp) {
  LossScalerConfig c;
  c.enabled = amp == Amp::fp16;
  return c;
}

// The line a guard starts with: where it writes, and what a failed step will
// trigger, so nobody learns the fallback's policy from its first firing.
std::string start_text(const GuardOptions& o, const std::string& run_file, const TrainableModel& model) {
  std::string fallback = std::string("fallback ") + fallback_mode_name(o.fallback) + " (";
  const bool keeps_own = FallbackPolicy::keeps_own_precision(model);
  switch (o.fallback) {
    case FallbackMode::automatic:
      fallback +=
          "a non-finite step gets the remedy its diagnosis supports: a data fault or a transient is "
          "skipped, modules that need fp32 go to fp32, else the whole model";
      break;
    case FallbackMode::whole:
      fallback += o.amp == Amp::fp32 || keeps_own
                      ? "the first non-finite step cuts the LR x " + number_text(o.lr_backoff)
                      : "the first non-finite step switches the whole model to fp32 for the rest of "
                        "the run, LR x " +
                            number_text(o.lr_backoff);
      break;
    case FallbackMode::off:
    case FallbackMode::unknown: fallback += "a non-finite step is skipped, nothing more"; break;
  }
  if (keeps_own && o.fallback == FallbackMode::automatic)
    fallback +=
        "; the model's own " + model.own_float_type_name() + " weights stay, so its whole-model fallback is the LR cut";
  else if (keeps_own && o.fallback == FallbackMode::whole)
    fallback += ", the model's own " + model.own_float_type_name() + " weights staying " + model.own_float_type_name();
  // "fp32" is no autocast: the model's own precision, which a float64 model says.
  const std::string amp = o.amp == Amp::fp32 && model.own_float_type() != at::kFloat
                              ? "off (the model's own " + model.own_float_type_name() + ")"
                              : precision_name(o.amp);
  return "nanscope: writing " + run_file + "; amp " + amp + ", " + fallback + "), clip " +
         (o.clip > 0 ? number_text(o.clip) : std::string("off")) + ", rollback " + (o.rollback.enabled ? "on" : "off") +
         ", warnings " + (o.warn ? "on" : "off");
}

std::string run_file_path(const GuardOptions& o) {
  return (std::filesystem::path(o.run_dir) / format::run_file_name(o.rank, o.world_size)).string();
}

}  // namespace

StepGuard::Impl::Impl(GuardedModel model, torch::optim::Optimizer* optimizer, GuardOptions options)
    : steered_(std::move(model), optimizer, options.model_name),
      options_(checked(std::move(options))),
      parameters_(trainable_tensors(steered_.model)),
      probe_(probe_options(options_), trainable_names(steered_.model)),
      scaler_(scaler_config(options_.amp)),
      journal_(options_.log, options_.log_prefix, options_.model_name, options_.rank, run_file_path(options_),
               [this] { return open_run_file(); }),
      sentinel_(options_.sentinel),
      forensics_memory_(options_.max_snapshots),
      doom_(size_t(std::max(0.0, options_.doom_search.memory_mb) * 1024 * 1024)),
      recovery_(options_, steered_, scaler_, parameters_, journal_, forensics_memory_, doom_),
      forensics_(steered_, parameters_, probe_, journal_, forensics_memory_, recovery_.memory(), options_),
      fp32_modules_checked_(options_.fp32_modules.empty()) {
  refuse_16bit_fp32_modules();
  use_cpu_kernels_from_environment();
  if (options_.doom_search.enabled) kept_batches_.copy_always();
  // Births in a native model are named by the module whose tensors an op
  // reads where no module scope is open.
  register_tensor_owners(steered_.model);
  std::filesystem::create_directories(options_.run_dir);
  // A new run's file is made now, so that a viewer can follow the run from
  // its start; nanscope-train's --resume cuts its file back to the
  // checkpoint now. A file already there from an earlier run waits for the
  // first row: a state put back before it (load_state_dict) means go on with it.
  if (options_.resume_after_step >= 0 || !std::filesystem::exists(journal_.path())) journal_.writer();
  journal_.announce(start_text(options_, journal_.path(), steered_.model));
}

// The run file, at its first row or event (Journal): nanscope-train's
// --resume appends to it after its checkpoint's step; a guard whose state
// was put back before it wrote anything (load_state_dict, restore) appends
// after the step before the one it numbers from; any other guard starts a
// new file, and one already there from an earlier run is kept beside it
// (run.1.h5 ...), never overwritten.
std::unique_ptr<format::RunWriter> StepGuard::Impl::open_run_file() {
  const std::string& path = journal_.path();
  const bool earlier = std::filesystem::exists(path);
  if (options_.resume_after_step >= 0 || (restored_ && earlier)) {
    const int64_t kept = options_.resume_after_step >= 0 ? options_.resume_after_step : next_step_ - 1;
    auto writer = format::RunWriter::resume(path, kept);
    writer->event(kept, format::EventKind::resume,
                  options_.resume_after_step >= 0 ? options_.resume_from : "the guard's state put back");
    writer->flush();
    return writer;
  }
  if (earlier) {
    const std::string aside = format::keep_aside(path);
    journal_.announce("nanscope: " + path + " was there from an earlier run: kept as " + aside +
                      " (a guard whose state is put back first goes on appending to it instead)");
  }
  format::RunHeader header;
  header.origin = options_.origin;
  if (options_.probe) header.layer_names = probe_.layers().layer_names();
  header.record_act_absmax = options_.act_absmax_every > 0;
  header.config = recorded_config(options_);
  return std::make_unique<format::RunWriter>(path, header);
}

GuardState StepGuard::Impl::state() const {
  GuardState s;
  recovery_.write_to(s);
  s.scaling = scaler_.enabled();
  s.loss_scale = scaler_.scale();
  s.growth_tracker = scaler_.growth_tracker();
  s.sentinel = sentinel_.state();
  return s;
}

void StepGuard::Impl::restore(const GuardState& s) {
  restored_ = true;
  recovery_.restore(s);
  if (!s.scaling) scaler_.disable();
  scaler_.restore(s.loss_scale, s.growth_tracker);
  fp32_modules_checked_ = true;  // checked by the run that chose them
  if (!s.sentinel.empty()) sentinel_.restore(s.sentinel);
}

StateHealth StepGuard::Impl::health() const { return state_health(steered_.model, &steered_.optimizer); }

}  // namespace nanscope
