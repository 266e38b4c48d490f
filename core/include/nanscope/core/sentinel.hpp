#pragma once
// Early warning: watches the numbers every step already brings to the host
// (the loss, the global grad norm, the loss scale, the per-layer grad norms,
// and the per-layer activation abs-max on the steps that record it) and says
// when a run is heading for a NaN, before it gets there. No device work and no
// host sync of its own.
//
// Signals, each against a baseline that needs `warmup` finite steps first:
// - grad_norm_spike: log(grad norm) more than `spike_z` deviations above its
//   running mean (ZClip's test), and at least `spike_ratio` times it (a
//   steady baseline's small deviation turns a 2x jump into z > 6), on two
//   steps in a row (a clean run's norm jumps 5-13x for a step or two);
// - grad_norm_growth: the grad norm's short average more than `growth_ratio`
//   times its long one (slow growth a z-score adapts to), and above the
//   highest the long average has been since warm-up (a converged run's
//   norms wander up and down far below where training started), for
//   `growth_steps` steps in a row (a clean run's burst of spikes lifts the
//   short average as much for a few steps, then falls back);
// - layer_grad_norm: the same spike test per layer, at least
//   `layer_spike_ratio` times its baseline, on two steps in a row, and the
//   layer carrying at least `layer_share` of the step's global grad norm,
//   naming the layer. A layer's own norm is noisy (a LayerNorm gain's jumps
//   tenfold for a batch on clean runs); what can push a step out of range is a
//   layer whose gradient is most of the step's;
// - loss_spike: a loss `loss_spike_ratio` times the largest seen (Megatron's test);
// - loss_jump, grad_norm_jump: a finite loss or global grad norm `jump_ratio`
//   times the largest before it, from the second finite step on (no warm-up):
//   an update that multiplies the loss a thousandfold is trouble on any step,
//   and the next step is often already non-finite;
// - loss_scale_collapse: fp16's scale `scale_collapse` times below its peak;
// - activation_headroom: a layer's abs-max (or the inputs') growing towards
//   the square root of the largest value of the precision it runs in (norms
//   and variances square what they get: squares overflow first), with the
//   steps left at the current rate.
// A signal (per layer) that fired stays quiet for `quiet_steps` steps.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

struct SentinelOptions {
  int64_t warmup = 20;
  double spike_z = 6.0;
  double spike_ratio = 10.0;
  double layer_spike_ratio = 10.0;
  double layer_share = 0.5;  // of the step's global grad norm
  double jump_ratio = 1000.0;
  double growth_ratio = 3.0;
  int64_t growth_steps = 4;  // steps in a row the growth must hold
  double loss_spike_ratio = 10.0;
  double scale_collapse = 1024.0;
  double headroom_steps = 100.0;  // warn when the activation limit is this few steps away
  int64_t quiet_steps = 50;
};

// One finite step's host values.
struct StepSignals {
  double loss = 0;
  double grad_norm = 0;
  double loss_scale = 1;
  double precision_limit =
      format::largest_finite(format::Precision::bf16);  // the step precision's largest finite value
  const std::vector<std::string>* layer_names = nullptr;
  const std::vector<float>* layer_grad_norm = nullptr;   // per layer, or empty
  const std::vector<float>* layer_act_absmax = nullptr;  // per layer on recording steps, or empty
  double input_absmax = 0;                               // the batch's largest magnitude (0: not known)
};

struct Warning {
  std::string signal;  // grad_norm_spike, grad_norm_growth, layer_grad_norm, loss_spike, ...
  std::string where;   // the layer, or "" for the whole model
  double value = 0, baseline = 0;
  std::optional<double> steps_to_limit;
  std::string text;  // one line: signal, where, value, baseline, steps to the limit
};

class Sentinel {
 public:
  explicit Sentinel(SentinelOptions options = {});

  // Feeds a finite step; returns the warnings that fire at it.
  std::vector<Warning> observe(int64_t step, const StepSignals& signals);

  // What it has learnt (baselines, averages, peaks, when each signal last
  // fired), as numbers by name, for a resumed run to go on from
  // (sentinel_state.cpp): "grad/mean", "layer/blocks.0.ln1/mean", ...
  using State = std::map<std::string, double>;
  State state() const;
  void restore(const State& state);

 private:
  // A running mean and variance (exponential) of log values.
  struct Baseline {
    double mean = 0, var = 0;
    int64_t count = 0;
    void add(double x, double alpha);
    double z(double x) const;
  };
  // Calls visit(name, field) for every number state() and restore() carry,
  // const or not: the one list of them (sentinel_state.cpp).
  template <class Self, class Visit>
  static void visit_scalars(Self& self, Visit&& visit);
  bool quiet(const std::string& key, int64_t step);
  void fire(std::vector<Warning>& out, int64_t step, Warning w);
  // observe()'s tests, one signal each; `warm`: past the warm-up.
  struct Jumps {
    bool loss = false, grad_norm = false;
  };
  Jumps observe_jumps(std::vector<Warning>& out, int64_t step, const StepSignals& s);
  void observe_grad_norm(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm, bool jumped);
  void observe_layers(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm);
  void observe_loss(std::vector<Warning>& out, int64_t step, const StepSignals& s, bool warm, bool jumped);
  void observe_loss_scale(std::vector<Warning>& out, int64_t step, const StepSignals& s);
  void observe_headroom(std::vector<Warning>& out, int64_t step, const std::string& where, double absmax,
                        double precision_limit, bool warm);

  SentinelOptions options_;
  int64_t finite_steps_ = 0;
  Baseline grad_;
  bool grad_spike_pending_ = false;        // the last step was a spike, held out of the baseline
  double grad_short_ = 0, grad_long_ = 0;  // exponential averages of log grad norm
  double grad_long_peak_ = -1e300;         // the highest grad_long_ since warm-up
  int64_t growing_steps_ = 0;              // steps in a row the growth test held
  struct LayerBaseline {
    Baseline norm;
    bool spike_pending = false;  // the last step was a spike, held out of the baseline
  };
  std::map<std::string, LayerBaseline> layer_grad_;
  double max_loss_ = 0;
  // The largest loss and global grad norm before this step, jumps left out.
  double jump_loss_bar_ = 0, jump_grad_norm_bar_ = 0;
  double peak_scale_ = 0;
  struct Headroom {
    int64_t step = -1, count = 0;
    double short_avg = 0, long_avg = 0;  // exponential averages of log2(abs-max)
  };
  std::map<std::string, Headroom> headroom_;
  std::map<std::string, int64_t> last_fired_;
};

}  // namespace nanscope
