#include "nanscope/core/sentinel.hpp"

#include <algorithm>
#include <cmath>

#include "nanscope/format/event_text.hpp"

namespace nanscope {

namespace {

constexpr double kBaselineAlpha = 0.05;  // about the last 20 steps
constexpr double kShortAlpha = 0.3;      // about the last 3 steps
constexpr double kLongAlpha = 0.02;      // about the last 50 steps

}  // namespace

void Sentinel::Baseline::add(double x, double alpha) {
  if (count++ == 0) {
    mean = x;
    var = 0;
    return;
  }
  const double d = x - mean;
  mean += alpha * d;
  var = (1 - alpha) * (var + alpha * d * d);
}

double Sentinel::Baseline::z(double x) const {
  // A floor on the deviation: a perfectly steady baseline must not turn a
  // few percent of noise into a spike.
  const double sd = std::max(std::sqrt(var), 0.05);
  return (x - mean) / sd;
}

Sentinel::Sentinel(SentinelOptions options) : options_(options) {}

bool Sentinel::quiet(const std::string& key, int64_t step) {
  auto it = last_fired_.find(key);
  return it != last_fired_.end() && step - it->second < options_.quiet_steps;
}

void Sentinel::fire(std::vector<Warning>& out, int64_t step, Warning w) {
  const std::string key = w.signal + "/" + w.where;
  if (quiet(key, step)) return;
  last_fired_[key] = step;
  w.text = format::warning_text({w.signal, w.where, w.value, w.baseline, w.steps_to_limit});
  out.push_back(std::move(w));
}

std::vector<Warning> Sentinel::observe(int64_t step, const StepSignals& s) {
  std::vector<Warning> out;
  const bool warm = finite_steps_ >= options_.warmup;
  const Jumps jumped = observe_jumps(out, step, s);
  observe_grad_norm(out, step, s, warm, jumped.grad_norm);
  observe_layers(out, step, s, warm);
  observe_loss(out, step, s, warm, jumped.loss);
  observe_loss_scale(out, step, s);
  // Headroom per layer on the steps that record activations, and for the inputs every step.
  if (s.layer_names && s.layer_act_absmax && s.layer_act_absmax->size() == s.layer_names->size())
    for (size_t i = 0; i < s.layer_names->size(); ++i)
      observe_headroom(out, step, (*s.layer_names)[i], (*s.layer_act_absmax)[i], s.precision_limit, warm);
  observe_headroom(out, step, "inputs", s.input_absmax, s.precision_limit, warm);
  ++finite_steps_;
  return out;
}

// An absurd jump needs no baseline: a thousandfold loss or grad norm after
// one healthy step is as telling as after a thousand. A jump is not reported
// a second time as a spike of the same number.
Sentinel::Jumps Sentinel::observe_jumps(std::vector<Warning>& out, int64_t step, const StepSignals& s) {
  Jumps jumped;
  jumped.loss = std::isfinite(s.loss) && jump_loss_bar_ > 0 && s.loss >= options_.jump_ratio * jump_loss_bar_;
  jumped.grad_norm =
      std::isfinite(s.grad_norm) && jump_grad_norm_bar_ > 0 && s.grad_norm >= options_.jump_ratio * jump_grad_norm_bar_;
  if (jumped.loss) fire(out, step, {"loss_jump", "", s.loss, jump_loss_bar_, {}, ""});
  if (jumped.grad_norm) fire(out, step, {"grad_norm_jump", "", s.grad_norm, jump_grad_norm_bar_, {}, ""});
  // Neither raises the bar for the next: a second jump is measured against healthy steps too.
  if (std::isfinite(s.loss) && !jumped.loss) jump_loss_bar_ = std::max(jump_loss_bar_, s.loss);
  if (std::isfinite(s.grad_norm) && !jumped.grad_norm) jump_grad_norm_bar_ = std::max(jump_grad_norm_bar_, s.grad_norm);
  return jumped;
}

// The global grad norm: a spike against the running baseline, and growth of
// the short average over the long one.
void Sentinel::observe_grad_norm(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm,
                                 bool jumped) {
  if (!(s.grad_norm > 0) || !std::isfinite(s.grad_norm)) return;
  const double g = std::log(s.grad_norm);
  // Like a layer's, a spike must last: a clean GPT fed its text in order
  // spikes 5-13x for a few steps at a surprising window and recovers. The
  // first spiking step is held out of the baseline, the second warns.
  const bool spike =
      warm && !jumped && grad_.z(g) > options_.spike_z && g - grad_.mean > std::log(options_.spike_ratio);
  const bool spike_lasts = spike && grad_spike_pending_;
  grad_spike_pending_ = spike && !grad_spike_pending_;
  if (spike_lasts) fire(out, step, {"grad_norm_spike", "", s.grad_norm, std::exp(grad_.mean), {}, ""});
  // Growth is trouble when it goes on: a burst of a few spiking steps lifts
  // the short average as much for a while, then falls back.
  const bool growing =
      warm && grad_short_ - grad_long_ > std::log(options_.growth_ratio) && grad_short_ > grad_long_peak_;
  growing_steps_ = growing ? growing_steps_ + 1 : 0;
  if (growing_steps_ >= options_.growth_steps)
    fire(out, step, {"grad_norm_growth", "", std::exp(grad_short_), std::exp(grad_long_), {}, ""});
  if (!grad_spike_pending_) grad_.add(g, kBaselineAlpha);
  grad_short_ = finite_steps_ == 0 ? g : grad_short_ + kShortAlpha * (g - grad_short_);
  grad_long_ = finite_steps_ == 0 ? g : grad_long_ + kLongAlpha * (g - grad_long_);
  if (warm) grad_long_peak_ = std::max(grad_long_peak_, grad_long_);
}

// Per layer: the same spike test, naming the layer, on two steps in a row,
// for a layer that carries a real share of the step's gradient. One layer's
// norm is far noisier than the sum of all: on clean GPT runs a LayerNorm
// gain's norm, about 1% of the global norm, jumps 10-17x for a batch or two
// now and then; a layer that small cannot push a step out of range however
// it moves against its own past. A layer going wrong becomes most of the
// step's norm. Trouble persists. The first spike is held out of the
// baseline, so the second is measured against the layer as it was.
void Sentinel::observe_layers(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm) {
  if (!s.layer_names || !s.layer_grad_norm || s.layer_grad_norm->size() != s.layer_names->size()) return;
  for (size_t i = 0; i < s.layer_names->size(); ++i) {
    const double v = (*s.layer_grad_norm)[i];
    if (!(v > 0) || !std::isfinite(v)) continue;
    LayerBaseline& layer = layer_grad_[(*s.layer_names)[i]];
    Baseline& b = layer.norm;
    const double x = std::log(v);
    const bool carries_the_step = v >= options_.layer_share * s.grad_norm;
    const bool spike =
        warm && carries_the_step && b.z(x) > options_.spike_z && x - b.mean > std::log(options_.layer_spike_ratio);
    if (spike && !layer.spike_pending) {
      layer.spike_pending = true;
      continue;
    }
    if (spike) fire(out, step, {"layer_grad_norm", (*s.layer_names)[i], v, std::exp(b.mean), {}, ""});
    layer.spike_pending = false;
    b.add(x, kBaselineAlpha);
  }
}

// The loss against the largest seen. A spike does not raise the bar: after a
// burst (and its rollback) the next spike must still be measured against the
// healthy losses.
void Sentinel::observe_loss(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm, bool jumped) {
  if (!std::isfinite(s.loss)) return;
  if (warm && max_loss_ > 0 && s.loss >= options_.loss_spike_ratio * max_loss_) {
    if (!jumped) fire(out, step, {"loss_spike", "", s.loss, max_loss_, {}, ""});
  } else if (!jumped) {
    max_loss_ = std::max(max_loss_, s.loss);
  }
}

// fp16's loss scale collapsing: overflow after overflow.
void Sentinel::observe_loss_scale(std::vector<Warning>& out, int64_t step, const StepSignals& s) {
  if (!(s.loss_scale > 0)) return;
  if (peak_scale_ > 0 && s.loss_scale * options_.scale_collapse <= peak_scale_)
    fire(out, step, {"loss_scale_collapse", "", s.loss_scale, peak_scale_, {}, ""});
  peak_scale_ = std::max(peak_scale_, s.loss_scale);
}

// Headroom: log2(sqrt(limit) / absmax) and how fast it shrinks.
void Sentinel::observe_headroom(std::vector<Warning>& out, int64_t step, const std::string& where, double a,
                                double precision_limit, bool warm) {
  if (!(a > 0) || !std::isfinite(a)) return;
  Headroom& h = headroom_[where];
  const double x = std::log2(a);
  if (h.count++ == 0) {
    h.short_avg = h.long_avg = x;
  } else {
    h.short_avg += kShortAlpha * (x - h.short_avg);
    h.long_avg += kBaselineAlpha * (x - h.long_avg);
  }
  // Under steady growth of r bits per observation the two averages lag by
  // r(1-a)/a each, so their gap over the difference of the lags is r; batch
  // to batch noise mostly cancels in it.
  const double lag_gap = (1 - kBaselineAlpha) / kBaselineAlpha - (1 - kShortAlpha) / kShortAlpha;
  const double interval = h.step >= 0 ? double(std::max<int64_t>(1, step - h.step)) : 1.0;
  const double bits_per_step = (h.short_avg - h.long_avg) / lag_gap / interval;
  h.step = step;
  if (!warm || h.count < 10 || bits_per_step <= 0) return;
  const double steps_left = (std::log2(precision_limit) / 2 - x) / bits_per_step;
  if (steps_left < options_.headroom_steps)
    fire(out, step, {"activation_headroom", where, a, std::exp2(h.long_avg), steps_left, ""});
}

}  // namespace nanscope
