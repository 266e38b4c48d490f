// A sentinel's baselines as numbers by name, and back: what a guard's
// state_dict carries so that a resumed run warns against the run it continues,
// not against a fresh warm-up. Per-layer and per-place entries are
// "layer/NAME/FIELD", "headroom/WHERE/FIELD" and "fired/SIGNAL/WHERE" (module
// paths hold dots, never slashes; a fired key is taken whole).
#include <string>

#include "nanscope/core/sentinel.hpp"

namespace nanscope {

Sentinel::State Sentinel::state() const {
  State s;
  s["finite_steps"] = double(finite_steps_);
  s["grad/mean"] = grad_.mean;
  s["grad/var"] = grad_.var;
  s["grad/count"] = double(grad_.count);
  s["grad/spike_pending"] = grad_spike_pending_;
  s["grad/short"] = grad_short_;
  s["grad/long"] = grad_long_;
  s["grad/long_peak"] = grad_long_peak_;
  s["grad/growing_steps"] = double(growing_steps_);
  s["loss/max"] = max_loss_;
  s["jump/loss"] = jump_loss_bar_;
  s["jump/grad_norm"] = jump_grad_norm_bar_;
  s["scale/peak"] = peak_scale_;
  for (const auto& [name, layer] : layer_grad_) {
    const std::string key = "layer/" + name + "/";
    s[key + "mean"] = layer.norm.mean;
    s[key + "var"] = layer.norm.var;
    s[key + "count"] = double(layer.norm.count);
    s[key + "spike_pending"] = layer.spike_pending;
  }
  for (const auto& [where, h] : headroom_) {
    const std::string key = "headroom/" + where + "/";
    s[key + "step"] = double(h.step);
    s[key + "count"] = double(h.count);
    s[key + "short"] = h.short_avg;
    s[key + "long"] = h.long_avg;
  }
  for (const auto& [key, step] : last_fired_) s["fired/" + key] = double(step);
  return s;
}

void Sentinel::restore(const State& s) {
  *this = Sentinel(options_);
  auto field = [](const std::string& key, const std::string& prefix, std::string& name) {
    if (key.rfind(prefix, 0) != 0) return std::string();
    const size_t slash = key.rfind('/');
    if (slash <= prefix.size()) return std::string();
    name = key.substr(prefix.size(), slash - prefix.size());
    return key.substr(slash + 1);
  };
  for (const auto& [key, value] : s) {
    std::string name;
    if (key == "finite_steps")
      finite_steps_ = int64_t(value);
    else if (key == "grad/mean")
      grad_.mean = value;
    else if (key == "grad/var")
      grad_.var = value;
    else if (key == "grad/count")
      grad_.count = int64_t(value);
    else if (key == "grad/spike_pending")
      grad_spike_pending_ = value != 0;
    else if (key == "grad/short")
      grad_short_ = value;
    else if (key == "grad/long")
      grad_long_ = value;
    else if (key == "grad/long_peak")
      grad_long_peak_ = value;
    else if (key == "grad/growing_steps")
      growing_steps_ = int64_t(value);
    else if (key == "loss/max")
      max_loss_ = value;
    else if (key == "jump/loss")
      jump_loss_bar_ = value;
    else if (key == "jump/grad_norm")
      jump_grad_norm_bar_ = value;
    else if (key == "scale/peak")
      peak_scale_ = value;
    else if (key.rfind("fired/", 0) == 0)
      last_fired_[key.substr(6)] = int64_t(value);
    else if (const std::string f = field(key, "layer/", name); !f.empty()) {
      LayerBaseline& layer = layer_grad_[name];
      if (f == "mean")
        layer.norm.mean = value;
      else if (f == "var")
        layer.norm.var = value;
      else if (f == "count")
        layer.norm.count = int64_t(value);
      else if (f == "spike_pending")
        layer.spike_pending = value != 0;
    } else if (const std::string g = field(key, "headroom/", name); !g.empty()) {
      Headroom& h = headroom_[name];
      if (g == "step")
        h.step = int64_t(value);
      else if (g == "count")
        h.count = int64_t(value);
      else if (g == "short")
        h.short_avg = value;
      else if (g == "long")
        h.long_avg = value;
    }
  }
}

}  // namespace nanscope
