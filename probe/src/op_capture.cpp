#include "nanscope/probe/op_capture.hpp"

#include <ATen/core/function_schema.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "module_path.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/tensor_owners.hpp"
#include "op_arguments.hpp"
#include "tensor_stats.hpp"

namespace nanscope::probe {

namespace {

// RecordFunction callbacks are plain function pointers, so the capture's
// state is global; one OpCapture may be alive at a time.
struct Candidate {
  format::Birth birth;
  int64_t start_index = 0;     // order of the op's start: nesting = started later, ended earlier
  int64_t forward_index = -1;  // the forward op whose module it is named by (tensor_owners.hpp)
};

// A trail entry: the record, and its output until its stats are computed.
struct TrailEntry {
  format::OpRecord record;
  at::Tensor output;  // detached; stats computed when the capture's result is read
  int64_t forward_index = -1;
};

struct CaptureState {
  std::mutex mutex;
  CaptureOptions options;
  int64_t next_start = 0;
  int64_t next_end = 0;
  bool any_nonfinite = false;
  std::deque<TrailEntry> trail;
  bool trail_frozen = false;        // set at the first birth of either kind
  int64_t frozen_birth_start = -1;  // start index of that birth
  std::optional<Candidate> first_nan, first_inf;
  struct ForwardOp {
    std::string op, module;
    int64_t index = -1;
  };
  std::unordered_map<int64_t, ForwardOp> forward_ops;  // by autograd seqNr
  std::vector<std::string> modules_seen;               // forward modules from scopes, first-seen order
  // A native model without scopes (tensor_owners.hpp): forward ops that read
  // a registered tensor, by op index.
  std::map<int64_t, std::string> owner_at;
  // The op index each micro-batch's re-run began at: the ops around an op are
  // looked for within its own micro-batch's forward only.
  std::vector<int64_t> micro_batch_starts;

  // The module of forward op `index`: its scope's, else its tensors' owner,
  // else the innermost module around it.
  std::string module_of(int64_t index, const std::string& scoped) const {
    if (!scoped.empty() || owner_at.empty()) return scoped;
    int64_t from = 0, to = std::numeric_limits<int64_t>::max();
    for (int64_t start : micro_batch_starts) {
      if (start <= index)
        from = start;
      else {
        to = start;
        break;
      }
    }
    auto next = owner_at.lower_bound(index);
    if (next != owner_at.end() && next->first == index) return next->second;
    if (next == owner_at.begin() || next == owner_at.end() || next->first >= to || std::prev(next)->first < from)
      return "";
    return common_module(std::prev(next)->second, next->second);
  }
};

CaptureState* g_state = nullptr;
bool g_scopes_were_enabled = false;
bool g_installed = false;
at::CallbackHandle g_handle = 0;

// The callback's own reductions are ops too: this guard keeps it from
// recording itself.
thread_local bool t_in_callback = false;
struct ReentryGuard {
  ReentryGuard() { t_in_callback = true; }
  ~ReentryGuard() { t_in_callback = false; }
};

struct BackwardNode {
  std::string name;
  int64_t seq_nr;
};
thread_local std::vector<BackwardNode> t_backward_nodes;

struct OpContext : at::ObserverContext {
  bool is_node = false;
  int64_t start_index = 0;
  std::string module;
  bool input_nan = false, input_inf = false;
  bool scalar_inf = false;           // an infinite scalar (masked_fill(x, m, -inf)) may put infinities anywhere
  std::optional<std::string> owner;  // the module whose parameter or buffer it reads (no scope open)
  // The floating inputs (in-place ops: a copy as they were at the start) and
  // scalar inputs; full statistics only if this op turns out to be a birth.
  std::vector<at::Tensor> input_tensors;
  std::vector<format::TensorStats> scalar_inputs;
  int64_t counted_targets = -1;  // a loss with ignore_index: the targets it counts
  OpArity arity;                 // how many of RecordFunction's values are the op's own
};

void note_input(const c10::IValue& value, bool in_place_self, OpContext& ctx) {
  auto add_tensor = [&](const at::Tensor& t) {
    FiniteFlags f = finite_flags(t);
    ctx.input_nan |= f.nan;
    ctx.input_inf |= f.inf;
    ctx.input_tensors.push_back(in_place_self ? t.detach().clone() : t.detach());
  };
  if (value.isTensor()) {
    if (is_floating(value.toTensor())) add_tensor(value.toTensor());
  } else if (value.isDouble()) {
    format::TensorStats s = scalar_stats(value.toDouble());
    ctx.input_nan |= s.nan_count > 0;
    ctx.input_inf |= s.inf_count > 0;
    ctx.scalar_inf |= s.inf_count > 0;
    ctx.scalar_inputs.push_back(s);
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector())
      if (is_floating(t)) add_tensor(t);
  }
}

// Elementwise ops that can turn finite values into infinities (overflow, a
// zero divisor, log of 0, a cast to a narrower type). For these, output
// position i comes from input position i (after broadcasting), so an infinity
// can be told apart from one an input already held there.
bool is_pointwise_arithmetic(const std::string& op) {
  static const std::unordered_set<std::string> ops{
      "aten::exp",      "aten::exp2",       "aten::expm1",   "aten::pow",      "aten::mul",   "aten::div",
      "aten::add",      "aten::sub",        "aten::rsub",    "aten::square",   "aten::sinh",  "aten::cosh",
      "aten::tan",      "aten::reciprocal", "aten::rsqrt",   "aten::log",      "aten::log2",  "aten::log10",
      "aten::xlogy",    "aten::addcmul",    "aten::addcdiv", "aten::lerp",     "aten::where", "aten::to",
      "aten::_to_copy", "aten::copy",       "aten::type_as", "aten::softplus", "aten::ldexp", "aten::float_power"};
  const bool in_place = !op.empty() && op.back() == '_';
  return ops.count(in_place ? op.substr(0, op.size() - 1) : op) > 0;
}

// A loss with an ignore_index argument (cross_entropy, nll_loss): how many of
// its targets it counts, or -1. A mean over none is 0 / 0 = NaN although every
// input is finite, and every gradient is exactly 0: the batch is the cause.
int64_t counted_targets(const at::RecordFunction& fn, const OpArity& arity) {
  if (std::string(fn.name()).find("loss") == std::string::npos) return -1;
  const auto schema = fn.operator_schema();
  if (!schema) return -1;
  const auto target = schema->argumentIndexWithName("target");
  const auto ignore = schema->argumentIndexWithName("ignore_index");
  const c10::ArrayRef<const c10::IValue> values = op_arguments(fn, arity);
  if (!target || !ignore || values.size() != schema->arguments().size()) return -1;
  const c10::IValue& t = values[*target];
  const c10::IValue& ignored = values[*ignore];
  if (!t.isTensor() || !ignored.isInt() || is_floating(t.toTensor())) return -1;  // class probabilities ignore nothing
  return (t.toTensor() != ignored.toInt()).sum().item<int64_t>();
}

bool broadcasts_to(at::IntArrayRef from, at::IntArrayRef to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 1; i <= from.size(); ++i)
    if (from[from.size() - i] != 1 && from[from.size() - i] != to[to.size() - i]) return false;
  return true;
}

// The refined Inf rule: an op whose inputs already hold infinities (a causal
// mask's -inf) still gives birth to one where its output holds an infinity at a
// position at which every input was finite: exp over masked attention logits
// that overflows to +inf. Ops that only carry infinities along (add of a mask,
// neg, where) hold them at the same positions as their inputs, so they are no
// births. Needs positions that correspond: pointwise ops whose inputs broadcast
// to the output; for any other op the plain rule stands.
bool holds_new_infinity(const std::string& op, const at::Tensor& output, const std::vector<at::Tensor>& inputs) {
  if (!output.defined() || !is_pointwise_arithmetic(op)) return false;
  at::Tensor inherited = at::zeros(output.sizes(), output.options().dtype(at::kBool));
  for (const at::Tensor& in : inputs) {
    if (!broadcasts_to(in.sizes(), output.sizes())) return false;
    inherited.logical_or_(at::isinf(in.to(output.device())).expand(output.sizes()));
  }
  return at::logical_and(at::isinf(output), inherited.logical_not()).any().item<bool>();
}

// The batch rows (positions) of `output` holding the birth's kind (NaN or
// Inf), when its first dimension is the batch and not every row went: which
// sample an internal birth came from, even where the batch cannot be
// bisected. At most 16.
std::vector<int64_t> nonfinite_batch_rows(const at::Tensor& output, int64_t batch_size, int64_t row_dim,
                                          format::BirthKind kind) {
  if (batch_size < 2 || output.dim() <= row_dim || output.size(row_dim) != batch_size) return {};
  const at::Tensor rows = output.movedim(row_dim, 0).reshape({batch_size, -1});
  const at::Tensor bad = (kind == format::BirthKind::nan ? at::isnan(rows) : at::isinf(rows)).any(1);
  if (bad.all().item<bool>()) return {};  // every row: not one sample's doing
  const at::Tensor found = bad.nonzero().flatten().slice(0, 0, 16).to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(found.data_ptr<int64_t>(), found.data_ptr<int64_t>() + found.numel());
}

std::unique_ptr<at::ObserverContext> capture_on_op_start(const at::RecordFunction& fn) {
  if (t_in_callback || !g_state || inside_bookkeeping_ops()) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    t_backward_nodes.push_back({fn.name(), fn.seqNr()});
    auto ctx = std::make_unique<OpContext>();
    ctx->is_node = true;
    return ctx;
  }
  if (fn.scope() != at::RecordScope::FUNCTION || makes_no_new_values(fn.name())) return nullptr;
  ReentryGuard guard;
  at::NoGradGuard no_grad;  // no graph nodes: they would shift every later seqNr
  auto ctx = std::make_unique<OpContext>();
  {
    std::lock_guard<std::mutex> lock(g_state->mutex);
    ctx->start_index = g_state->next_start++;
  }
  ctx->module = t_backward_nodes.empty() ? current_module_path() : std::string();
  const std::string name = fn.name();
  const bool in_place = !name.empty() && name.back() == '_';
  bool first = true;
  ctx->arity = op_arity(fn);
  const bool find_owner = ctx->module.empty() && t_backward_nodes.empty() && any_tensor_owners();
  for (const c10::IValue& input : op_arguments(fn, ctx->arity)) {
    note_input(input, in_place && first, *ctx);
    first = false;
    if (find_owner && !ctx->owner && input.isTensor()) ctx->owner = tensor_owner(input.toTensor());
  }
  // In the root's own scope (hooks that scope every module) an op that reads a
  // child's tensor itself, F.linear(x, self.emb.weight), is that child's; the
  // ops around it are the root's, so nothing is inferred between such reads.
  if (ctx->owner && inside_module_scope()) ctx->module = *std::exchange(ctx->owner, std::nullopt);
  ctx->counted_targets = counted_targets(fn, ctx->arity);
  return ctx;
}

void capture_on_op_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (!raw || !g_state) return;
  auto* ctx = static_cast<OpContext*>(raw);
  if (ctx->is_node) {
    if (!t_backward_nodes.empty()) t_backward_nodes.pop_back();
    return;
  }
  ReentryGuard guard;
  at::NoGradGuard no_grad;
  bool output_nan = false, output_inf = false;
  format::OpRecord record;
  record.op = fn.name();
  int64_t forward_index = -1;
  at::Tensor first_output;
  std::vector<int64_t> created_nodes;
  for (const c10::IValue& out : op_results(fn, ctx->arity)) {
    if (!out.isTensor() || !is_floating(out.toTensor())) continue;
    const at::Tensor& t = out.toTensor();
    FiniteFlags f = finite_flags(t);
    output_nan |= f.nan;
    output_inf |= f.inf;
    if (!first_output.defined()) first_output = t.detach();
    // Only the node this op created (its seqNr is the one peeked at its start);
    // a view or no-op such as resolve_conj returns a tensor of an older node.
    if (t.requires_grad() && t.grad_fn() && t.grad_fn()->sequence_nr() == uint64_t(fn.seqNr()))
      created_nodes.push_back(t.grad_fn()->sequence_nr());
  }
  std::lock_guard<std::mutex> lock(g_state->mutex);
  CaptureState& st = *g_state;
  record.index = st.next_end++;
  if (const std::optional<format::Phase> phase = current_phase_override()) {
    record.phase = *phase;
    record.module = ctx->module;
  } else if (t_backward_nodes.empty()) {
    record.phase = format::Phase::forward;
    record.module = ctx->module;
    record.seq_nr = fn.seqNr();
    forward_index = record.index;
    if (!record.module.empty() &&
        std::find(st.modules_seen.begin(), st.modules_seen.end(), record.module) == st.modules_seen.end())
      st.modules_seen.push_back(record.module);
    if (ctx->owner) st.owner_at[record.index] = *ctx->owner;
    // Outer ops end after the ops inside them, so the op the model called wins.
    for (int64_t seq : created_nodes) st.forward_ops[seq] = {record.op, record.module, record.index};
  } else {
    const BackwardNode& node = t_backward_nodes.back();
    record.phase = format::Phase::backward;
    record.backward_node = node.name;
    record.seq_nr = node.seq_nr;
    if (auto it = st.forward_ops.find(node.seq_nr); it != st.forward_ops.end()) {
      record.forward_op = it->second.op;
      record.module = it->second.module;
      forward_index = it->second.index;
    }
  }
  st.any_nonfinite |= output_nan || output_inf;
  if (!st.trail_frozen) {
    st.trail.push_back({record, first_output, forward_index});
    while (st.trail.size() > st.options.trail_length) st.trail.pop_front();
  }
  auto consider = [&](std::optional<Candidate>& slot, format::BirthKind kind) {
    // A later-ending op that started before the current birth encloses it:
    // report the enclosing (outer) op instead.
    if (slot && slot->start_index < ctx->start_index) return;
    const bool replaces_trail_end = slot && slot->start_index == st.frozen_birth_start;
    Candidate c;
    c.start_index = ctx->start_index;
    c.forward_index = forward_index;
    c.birth.op = record;
    if (first_output.defined()) {
      c.birth.op.output = tensor_stats(first_output);
      if (record.phase == format::Phase::forward)
        c.birth.rows = nonfinite_batch_rows(first_output, st.options.batch_size, st.options.row_dim, kind);
    }
    c.birth.micro_batch = st.options.micro_batch;
    c.birth.kind = kind;
    c.birth.counted_targets = ctx->counted_targets;
    for (const at::Tensor& t : ctx->input_tensors) c.birth.inputs.push_back(tensor_stats(t));
    for (const auto& scalar : ctx->scalar_inputs) c.birth.inputs.push_back(scalar);
    slot = c;
    // The trail ends at the first birth: it was pushed above while unfrozen;
    // an outer op taking that birth over ends right after it.
    if (!st.trail_frozen) {
      st.trail_frozen = true;
      st.frozen_birth_start = c.start_index;
    } else if (replaces_trail_end) {
      st.trail.push_back({c.birth.op, {}, forward_index});
      st.frozen_birth_start = c.start_index;
    }
  };
  if (output_nan && !ctx->input_nan) consider(st.first_nan, format::BirthKind::nan);
  if (output_inf && !ctx->input_nan &&
      (!ctx->input_inf || (!ctx->scalar_inf && holds_new_infinity(record.op, first_output, ctx->input_tensors))))
    consider(st.first_inf, format::BirthKind::inf);
}

}  // namespace

OpCapture::OpCapture(CaptureOptions options) {
  if (g_installed) throw std::logic_error("only one OpCapture may be active at a time");
  g_state = new CaptureState();
  g_state->options = options;
  g_scopes_were_enabled = detail::g_scopes_enabled;
  detail::g_scopes_enabled = true;
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(capture_on_op_start, capture_on_op_end)
                                       .needsInputs(true)
                                       .needsOutputs(true)
                                       .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  g_installed = true;
}

OpCapture::~OpCapture() {
  at::removeCallback(g_handle);
  detail::g_scopes_enabled = g_scopes_were_enabled;
  g_installed = false;
  delete g_state;
  g_state = nullptr;
}

std::vector<std::string> OpCapture::modules_seen() const {
  // Scoped modules only: the ones an fp32 region can switch (a module named
  // through its tensors has no scope to switch autocast off in).
  std::lock_guard<std::mutex> lock(g_state->mutex);
  return g_state->modules_seen;
}

void OpCapture::begin_micro_batch(int64_t index, int64_t batch_size, int64_t row_dim) {
  std::lock_guard<std::mutex> lock(g_state->mutex);
  g_state->options.micro_batch = index;
  g_state->micro_batch_starts.push_back(g_state->next_end);
  g_state->options.batch_size = batch_size;
  g_state->options.row_dim = row_dim;
}

format::Capture OpCapture::result() const {
  std::lock_guard<std::mutex> lock(g_state->mutex);
  const CaptureState& st = *g_state;
  format::Capture c;
  c.reproduced = st.any_nonfinite;
  c.ops_seen = st.next_end;
  auto named = [&](const Candidate& candidate) {
    format::Birth birth = candidate.birth;
    if (candidate.forward_index >= 0) birth.op.module = st.module_of(candidate.forward_index, birth.op.module);
    return birth;
  };
  if (st.first_nan) c.first_nan_birth = named(*st.first_nan);
  if (st.first_inf) c.first_inf_birth = named(*st.first_inf);
  // One op that gives birth to both is an Inf birth (docs/design.md): the NaN
  // beside an overflow is what the kernel's summation made of the infinity,
  // and whether it makes one differs between CPUs.
  if (c.first_nan_birth && c.first_inf_birth)
    c.first_birth = c.first_nan_birth->op.index < c.first_inf_birth->op.index ? c.first_nan_birth : c.first_inf_birth;
  else
    c.first_birth = c.first_nan_birth ? c.first_nan_birth : c.first_inf_birth;
  // Trail stats are computed now, from the outputs kept (an output changed in
  // place by a later op shows its later values; the births' stats are exact).
  ReentryGuard guard;
  at::NoGradGuard no_grad;
  for (const TrailEntry& entry : st.trail) {
    format::OpRecord record = entry.record;
    if (entry.forward_index >= 0) record.module = st.module_of(entry.forward_index, record.module);
    if (entry.output.defined()) record.output = tensor_stats(entry.output);
    c.trail.push_back(record);
  }
  return c;
}

}  // namespace nanscope::probe
