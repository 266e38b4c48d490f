// A sentinel's baselines as numbers by name, and back: what a guard's
// state_dict carries so that a resumed run warns against the run it continues,
// not against a fresh warm-up. Per-layer and per-place entries are
// "layer/NAME/FIELD" and "headroom/WHERE/FIELD" (module paths hold dots, never
// slashes), and "fired/KEY" for when each signal last fired.
#include <string>
#include <type_traits>

#include "nanscope/core/sentinel.hpp"

namespace nanscope {

template <class Self, class Visit>
void Sentinel::visit_scalars(Self& self, Visit&& visit) {
  visit("finite_steps", self.finite_steps_);
  visit("grad/mean", self.grad_.mean);
  visit("grad/var", self.grad_.var);
  visit("grad/count", self.grad_.count);
  visit("grad/spike_pending", self.grad_spike_pending_);
  visit("grad/short", self.grad_short_);
  visit("grad/long", self.grad_long_);
  visit("grad/long_peak", self.grad_long_peak_);
  visit("grad/growing_steps", self.growing_steps_);
  visit("loss/max", self.max_loss_);
  visit("jump/loss", self.jump_loss_bar_);
  visit("jump/grad_norm", self.jump_grad_norm_bar_);
  visit("scale/peak", self.peak_scale_);
  for (auto& [name, layer] : self.layer_grad_) {
    const std::string key = "layer/" + name + "/";
    visit(key + "mean", layer.norm.mean);
    visit(key + "var", layer.norm.var);
    visit(key + "count", layer.norm.count);
    visit(key + "spike_pending", layer.spike_pending);
  }
  for (auto& [where, h] : self.headroom_) {
    const std::string key = "headroom/" + where + "/";
    visit(key + "step", h.step);
    visit(key + "count", h.count);
    visit(key + "short", h.short_avg);
    visit(key + "long", h.long_avg);
  }
  for (auto& [key, step] : self.last_fired_) visit("fired/" + key, step);
}

Sentinel::State Sentinel::state() const {
  State s;
  visit_scalars(*this, [&](const std::string& name, const auto& field) { s[name] = double(field); });
  return s;
}

void Sentinel::restore(const State& s) {
  *this = Sentinel(options_);
  // The per-layer, per-place and fired entries exist once named: make them, then fill every field.
  auto middle = [](const std::string& key, const std::string& prefix) {
    const size_t slash = key.rfind('/');
    return key.rfind(prefix, 0) == 0 && slash > prefix.size() ? key.substr(prefix.size(), slash - prefix.size())
                                                              : std::string();
  };
  for (const auto& [key, value] : s) {
    if (const std::string layer = middle(key, "layer/"); !layer.empty()) layer_grad_[layer];
    if (const std::string where = middle(key, "headroom/"); !where.empty()) headroom_[where];
    if (key.rfind("fired/", 0) == 0) last_fired_[key.substr(6)];
  }
  visit_scalars(*this, [&](const std::string& name, auto& field) {
    if (auto it = s.find(name); it != s.end()) field = std::decay_t<decltype(field)>(it->second);
  });
}

}  // namespace nanscope
