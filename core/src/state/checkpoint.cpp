#include "nanscope/core/checkpoint.hpp"

#include <c10/core/GradMode.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "nanscope/core/fallback_mode.hpp"
#include "nanscope/format/archive.hpp"
#include "nanscope/format/error.hpp"
#include "nanscope/format/version.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope {

using probe::get_tensor;
using probe::put_tensor;

namespace {

// The guard's state as /training's attributes, one per field of its list
// (guard_state.hpp): a word for the precision, 0/1 for a flag, a list of
// names comma-joined (and left out when empty).
void put_field(const format::Group& t, const char* name, Amp amp) {
  t.set_attr(name, std::string(precision_name(amp)));
}
void put_field(const format::Group& t, const char* name, bool on) { t.set_attr(name, int64_t(on)); }
void put_field(const format::Group& t, const char* name, int64_t v) { t.set_attr(name, v); }
void put_field(const format::Group& t, const char* name, double v) { t.set_attr(name, v); }
void put_field(const format::Group& t, const char* name, const std::vector<std::string>& names) {
  if (!names.empty()) t.set_attr(name, fp32_modules_flag_value(names));
}

void get_field(const format::Group& t, const std::string& path, const char* name, Amp& amp) {
  const std::string word = t.attr_string(name);
  const std::optional<Amp> read = format::from_string<format::Precision>(word);
  if (!read) throw format::FormatError(path, "/training: unknown precision '" + word + "'");
  amp = *read;
}
void get_field(const format::Group& t, const std::string&, const char* name, bool& on) { on = t.attr_int(name) != 0; }
void get_field(const format::Group& t, const std::string&, const char* name, int64_t& v) { v = t.attr_int(name); }
void get_field(const format::Group& t, const std::string&, const char* name, double& v) { v = t.attr_double(name); }
void get_field(const format::Group& t, const std::string&, const char* name, std::vector<std::string>& names) {
  if (t.has_attr(name)) names = parse_fp32_modules(t.attr_string(name));  // none: absent
}

void put_resume_state(format::Group root, const ResumeState& r) {
  format::Group t = root.group("training");
  probe::put_named(t.group("optimizer"), r.optimizer_state);
  put_tensor(t, "cpu_rng", r.cpu_rng);
  for_each_guard_state_field(r.guard, [&](const char* name, const auto& field) { put_field(t, name, field); });
}

}  // namespace

StateHealth save_checkpoint(const std::string& path, const TrainableModel& model, int64_t step,
                            const ResumeState* resume, const torch::optim::Optimizer* optimizer, double loss,
                            bool keep_previous) {
  StateHealth health = state_health(model, optimizer);
  if (!health.finite()) return health;
  if (keep_previous) keep_as_previous(path);
  // The archive is written as PATH.part and renamed over PATH on close.
  format::Archive archive = format::Archive::create(path, format::kCheckpointFileKind);
  format::Group root = archive.root();
  ModelSpec spec = model.spec();
  root.set_attr("model", spec.name);
  root.set_attr("step", step);
  root.set_attr("finite", int64_t(1));
  root.set_attr("loss", loss);
  format::Group hparams = root.group("hparams");
  for (const auto& [key, value] : spec.hparams) hparams.set_attr(key, value);
  format::Group params = root.group("parameters");
  for (const auto& [name, tensor] : model.named_parameters()) put_tensor(params, name, tensor);
  format::Group buffers = root.group("buffers");
  for (const auto& [name, tensor] : model.named_buffers()) put_tensor(buffers, name, tensor);
  if (resume) put_resume_state(root, *resume);
  archive.close();
  return health;
}

std::optional<CheckpointHealth> checkpoint_health(const std::string& path) {
  format::Archive archive = format::Archive::open(path, format::kCheckpointFileKind);
  format::Group root = archive.root();
  if (!archive.version().at_least(1, 1)) return std::nullopt;  // 1.0 recorded no health
  CheckpointHealth h;
  h.finite = root.attr_int("finite") != 0;
  h.step = root.attr_int("step");
  h.loss = root.attr_double("loss");
  return h;
}

namespace {

void copy_into(const format::Group& group, const NamedTensors& targets, const std::string& path, const char* what) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    if (!group.has(name)) throw format::FormatError(path, std::string(what) + " '" + name + "' missing");
    at::Tensor value = get_tensor(group, name);
    if (value.sizes() != target.sizes())
      throw format::FormatError(path, std::string(what) + " '" + name + "' has shape " + c10::str(value.sizes()) +
                                          ", the model expects " + c10::str(target.sizes()));
    at::Tensor t = target;
    t.copy_(value);
  }
}

}  // namespace

int64_t load_checkpoint(const std::string& path, TrainableModel& model) {
  format::Archive archive = format::Archive::open(path, format::kCheckpointFileKind);
  format::Group root = archive.root();
  const std::string saved = root.attr_string("model");
  const ModelSpec spec = model.spec();
  if (saved != spec.name) throw format::FormatError(path, "holds a '" + saved + "' model, not '" + spec.name + "'");
  format::Group hparams = root.group("hparams");
  for (const auto& [key, value] : spec.hparams)
    if (hparams.has_attr(key) && hparams.attr_int(key) != value)
      throw format::FormatError(path, "was saved with " + key + "=" + std::to_string(hparams.attr_int(key)) +
                                          ", the model has " + std::to_string(value));
  copy_into(root.group("parameters"), model.named_parameters(), path, "parameter");
  copy_into(root.group("buffers"), model.named_buffers(), path, "buffer");
  return root.attr_int("step");
}

}  // namespace nanscope

namespace nanscope {

std::optional<ResumeState> load_resume_state(const std::string& path) {
  format::Archive archive = format::Archive::open(path, format::kCheckpointFileKind);
  format::Group root = archive.root();
  if (!root.has("training")) return std::nullopt;
  format::Group t = root.group("training");
  ResumeState r;
  r.optimizer_state = probe::get_named(t.group("optimizer"));
  r.cpu_rng = get_tensor(t, "cpu_rng");
  GuardState& g = r.guard;
  // 1.0 had neither applied_steps nor fp32_modules.
  const bool version_1_0 = !archive.version().at_least(1, 1);
  const bool before_1_7 = !archive.version().at_least(1, 7);
  for_each_guard_state_field(g, [&](const char* name, auto& field) {
    const char* stored = before_1_7 ? name_before_1_7(name) : name;
    if (version_1_0 && !t.has_attr(stored)) return;
    get_field(t, path, stored, field);
  });
  g.lr_multiplier_lacks_fallback = before_1_7;
  // 1.0 counted no updates: every step up to the last applied one is as good
  // a guess as any (it is exact for a run without skips).
  if (version_1_0) g.applied_steps = g.last_applied_step + 1;
  return r;
}

int64_t checkpoint_step(const std::string& path) {
  format::Archive archive = format::Archive::open(path, format::kCheckpointFileKind);
  return archive.root().attr_int("step");
}

std::string previous_checkpoint_path(const std::string& path) {
  std::filesystem::path p(path);
  const std::string ext = p.extension().string();
  return p.replace_extension().string() + ".previous" + (ext.empty() ? std::string(".h5") : ext);
}

void keep_as_previous(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) return;
  const std::string previous = previous_checkpoint_path(path), linking = previous + ".part";
  std::error_code ec;
  fs::remove(linking, ec);
  fs::create_hard_link(path, linking, ec);
  if (ec) fs::copy_file(path, linking, fs::copy_options::overwrite_existing);  // a file system without hard links
  fs::rename(linking, previous);
}

namespace {
// X.h5 -> "X.step-" and ".h5": the parts around the step number.
std::pair<std::string, std::string> step_checkpoint_name(const std::string& path) {
  const std::filesystem::path p(path);
  const std::string ext = p.extension().empty() ? std::string(".h5") : p.extension().string();
  return {p.stem().string() + ".step-", ext};
}
}  // namespace

std::string step_checkpoint_path(const std::string& path, int64_t steps_done) {
  const auto [stem, ext] = step_checkpoint_name(path);
  char digits[32];
  std::snprintf(digits, sizeof digits, "%07lld", static_cast<long long>(steps_done));
  return (std::filesystem::path(path).parent_path() / (stem + digits + ext)).string();
}

std::vector<std::pair<int64_t, std::string>> checkpoints_kept_by_step(const std::string& path) {
  namespace fs = std::filesystem;
  const auto [stem, ext] = step_checkpoint_name(path);
  const fs::path parent = fs::path(path).parent_path();
  std::vector<std::pair<int64_t, std::string>> kept;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent.empty() ? fs::path(".") : parent, ec)) {
    const std::string name = entry.path().stem().string();  // a ".part" being written has another extension
    if (entry.path().extension() != ext || name.rfind(stem, 0) != 0) continue;
    const std::string digits = name.substr(stem.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    kept.emplace_back(std::stoll(digits), (parent / entry.path().filename()).string());
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

void keep_by_step(const std::string& path, int64_t steps_done, int64_t keep) {
  namespace fs = std::filesystem;
  const std::string target = step_checkpoint_path(path, steps_done), linking = target + ".part";
  std::error_code ec;
  fs::remove(linking, ec);
  fs::create_hard_link(path, linking, ec);
  if (ec) fs::copy_file(path, linking, fs::copy_options::overwrite_existing);
  fs::rename(linking, target);
  std::vector<std::pair<int64_t, std::string>> kept = checkpoints_kept_by_step(path);
  for (size_t i = 0; i + size_t(keep) < kept.size(); ++i) fs::remove(kept[i].second, ec);
}

}  // namespace nanscope
