#include "nanscope/core/buffer_transaction.hpp"

#include <c10/core/GradMode.h>

#include "nanscope/probe/host_copy.hpp"
#include "nanscope/probe/module_scope.hpp"

namespace nanscope {

namespace {

int64_t version_of(const at::Tensor& t) { return int64_t(t._version()); }

// A buffer the model replaced (TorchScript can assign a new tensor to a
// buffer attribute) or the fallback cast gets a fresh copy of the right kind.
bool copy_fits(const at::Tensor& copy, const at::Tensor& buffer) {
  return copy.defined() && copy.sizes() == buffer.sizes() && copy.scalar_type() == buffer.scalar_type() &&
         copy.device() == buffer.device();
}

}  // namespace

void BufferTransaction::rebind(const TrainableModel& model) {
  NamedTensors buffers = model.named_buffers();
  bool same = buffers.size() == slots_.size();
  for (size_t i = 0; same && i < buffers.size(); ++i) same = buffers[i].first == slots_[i].name;
  if (!same) {
    // New model, or buffers added or removed: learn again.
    slots_.clear();
    for (auto& [name, tensor] : buffers) {
      // One host read per buffer, once: whether it holds infinities of its own.
      const bool own_infinities = tensor.defined() && at::isFloatingType(tensor.scalar_type()) && tensor.numel() > 0 &&
                                  !at::isfinite(tensor).all().item<bool>();
      slots_.push_back({name, tensor, {}, 0, Role::unknown, own_infinities});
    }
  } else {
    for (size_t i = 0; i < buffers.size(); ++i) slots_[i].buffer = buffers[i].second;
  }
}

void BufferTransaction::refresh_written_floating() {
  written_floating_.clear();
  for (const Slot& s : slots_)
    if (copies(s) && s.buffer.defined() && at::isFloatingType(s.buffer.scalar_type()))
      written_floating_.push_back({s.buffer, s.own_infinities ? s.copy : at::Tensor()});
}

void BufferTransaction::begin(const TrainableModel& model) {
  rebind(model);
  c10::NoGradGuard no_grad;
  for (Slot& s : slots_) {
    if (!s.buffer.defined()) continue;
    s.version = version_of(s.buffer);
    if (!copies(s)) continue;
    if (copy_fits(s.copy, s.buffer))
      probe::copy_into(s.copy, s.buffer);
    else
      s.copy = s.buffer.detach().clone();
  }
  refresh_written_floating();  // after the copies: a buffer with its own infinities is checked against its copy
  others_.resize(0);
  for (const auto& [name, tensor] : model.other_buffers())
    if (tensor.defined() && at::isFloatingType(tensor.scalar_type())) others_.push_back({name, tensor, {}});
  for (OtherSlot& o : others_) o.copy = o.buffer.detach().clone();
}

void BufferTransaction::commit() {
  bool changed = false;
  for (Slot& s : slots_) {
    if (!s.buffer.defined()) continue;
    const bool version_moved = version_of(s.buffer) != s.version;
    if (s.role == Role::constant && version_moved) {
      s.role = Role::written;  // written after all: copied from now on
      changed = true;
    } else if (s.role == Role::unknown) {
      // The first counted step decides. A value compare sees writes that no
      // version counter records (BatchNorm's kernel updates its statistics in place).
      const bool written = version_moved || !copy_fits(s.copy, s.buffer) || !at::equal(s.copy, s.buffer);
      s.role = written ? Role::written : Role::constant;
      if (!written) s.copy = at::Tensor();
      changed = true;
    }
  }
  if (changed) refresh_written_floating();
}

std::vector<std::string> BufferTransaction::roll_back(std::vector<std::string>* unrestorable) {
  c10::NoGradGuard no_grad;
  std::vector<std::string> restored;
  bool changed = false;
  for (Slot& s : slots_) {
    if (!s.buffer.defined()) continue;
    if (copies(s)) {
      // Put back only what moved: an equal buffer needs no write (and its
      // version stays as it was).
      if (version_of(s.buffer) != s.version || !at::equal(s.copy, s.buffer)) {
        s.buffer.copy_(s.copy);
        restored.push_back(s.name);
      }
    } else if (version_of(s.buffer) != s.version) {
      s.role = Role::written;
      changed = true;
      if (unrestorable) unrestorable->push_back(s.name);
    }
  }
  if (changed) refresh_written_floating();
  // Another model's buffers keep what the step's forward wrote, as in a loop
  // without the guard, unless it made them non-finite: a skipped step leaves
  // no NaN behind in a model the guard was told of.
  for (const OtherSlot& o : others_)
    if (!at::isfinite(o.buffer).all().item<bool>()) {
      o.buffer.copy_(o.copy);
      restored.push_back(o.name);
    }
  return restored;
}

std::vector<std::string> BufferTransaction::copied_names() const {
  std::vector<std::string> out;
  for (const Slot& s : slots_)
    if (copies(s)) out.push_back(s.name);
  return out;
}

int64_t BufferTransaction::copied_bytes() const {
  int64_t n = 0;
  for (const Slot& s : slots_)
    if (copies(s) && s.buffer.defined()) n += s.buffer.numel() * int64_t(s.buffer.element_size());
  return n;
}

// Inside a capture (the forensic re-run) these copies are nanscope's, not the
// model's: they must not name a module by the buffers they read.
KeepBuffers::KeepBuffers(const TrainableModel& model) {
  probe::BookkeepingOps bookkeeping;
  // The other models the loss runs too (a GAN's critic): a re-run is no step of theirs either.
  const NamedTensors own = model.named_buffers();
  for (const NamedTensors* buffers : {&own, &model.other_buffers()})
    for (const auto& [name, tensor] : *buffers)
      if (tensor.defined()) kept_.emplace_back(tensor, tensor.detach().clone());
}

at::Tensor KeepBuffers::turned_nonfinite() const {
  probe::BookkeepingOps bookkeeping;
  c10::NoGradGuard no_grad;
  at::Tensor any;
  for (const auto& [buffer, value] : kept_) {
    if (!at::isFloatingType(buffer.scalar_type()) || buffer.sizes() != value.sizes()) continue;
    // NaN != anything: a NaN anywhere counts, an unchanged -inf does not.
    const at::Tensor turned = (~at::isfinite(buffer) & (buffer != value)).any();
    any = any.defined() ? any.logical_or(turned) : turned;
  }
  return any;
}

KeepBuffers::~KeepBuffers() {
  probe::BookkeepingOps bookkeeping;
  c10::NoGradGuard no_grad;
  for (auto& [buffer, value] : kept_) {
    at::Tensor target = buffer;
    if (target.sizes() == value.sizes()) target.copy_(value);
  }
}

}  // namespace nanscope
