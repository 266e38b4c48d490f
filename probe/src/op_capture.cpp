#include "nanscope/probe/op_capture.hpp"

#include <ATen/SequenceNumber.h>
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
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "module_path.hpp"
#include "nanscope/common/torch_compat.hpp"
#include "nanscope/probe/module_scope.hpp"
#include "nanscope/probe/tensor_owners.hpp"
#include "op_arguments.hpp"
#include "tensor_stats.hpp"

namespace nanscope::probe {

namespace {

// The custom autograd Function a node belongs to, "" for an aten op's node:
// a Python Function's node is its class name + "Backward" (GradPoisonBackward),
// a C++ torch::autograd::Function<T>'s is torch::autograd::CppNode<T>.
// Generated aten nodes end in a digit (SqrtBackward0).
std::string custom_function_name(const std::string& node) {
  constexpr std::string_view cpp = "torch::autograd::CppNode<";
  if (node.rfind(cpp, 0) == 0 && node.back() == '>') {
    std::string function = node.substr(cpp.size(), node.size() - cpp.size() - 1);
    constexpr std::string_view anonymous = "(anonymous namespace)::";
    for (size_t at; (at = function.find(anonymous)) != std::string::npos;) function.erase(at, anonymous.size());
    return function;
  }
  constexpr std::string_view python = "Backward";
  if (node.find("::") == std::string::npos && node.size() > python.size() &&
      node.compare(node.size() - python.size(), python.size(), python) == 0)
    return node.substr(0, node.size() - python.size());
  return "";
}

// RecordFunction callbacks are plain function pointers, so the capture's
// state is global; one OpCapture may be alive at a time.
// A trail entry: the record, and its output until its stats are computed.
struct TrailEntry {
  format::OpRecord record;
  at::Tensor output;  // detached; stats computed when the capture's result is read
  int64_t forward_index = -1;
  int64_t evaluation = -1;
};

// One op that gave birth to a NaN, an Inf or both. Its id is its place in
// CaptureState::births, which the values it made carry (Lineage).
struct Candidate {
  // The birth of each kind this op made; an outer op that gives birth to the
  // same kind takes it over (reset here), as does an outer op whose output is
  // finite (it dropped what was made inside it).
  std::optional<format::Birth> nan, inf;
  int64_t start_index = 0;        // order of the op's start: nesting = started later, ended earlier
  int64_t forward_index = -1;     // the forward op whose module it is named by (tensor_owners.hpp)
  int64_t evaluation = -1;        // a backward op's node evaluation (CaptureState::evaluations)
  std::vector<TrailEntry> trail;  // the ops up to and including it (the first kTrailsKept births)
  bool any() const { return nan || inf; }
};

// Where a tensor's non-finite values came from: the ids of the births they
// descend from (the earliest kLineageIds), and whether some came from outside
// the ops seen (the batch; a weight, a scalar or an op the capture did not see).
struct Lineage {
  std::vector<int32_t> births;  // sorted
  bool from_batch = false, from_elsewhere = false;
  void add(const Lineage& other) {
    std::vector<int32_t> merged;
    std::set_union(births.begin(), births.end(), other.births.begin(), other.births.end(), std::back_inserter(merged));
    births = std::move(merged);
    from_batch |= other.from_batch;
    from_elsewhere |= other.from_elsewhere;
  }
  void add_birth(int32_t id) { add(Lineage{{id}, false, false}); }
  bool empty() const { return births.empty() && !from_batch && !from_elsewhere; }
};
constexpr size_t kLineageIds = 16;
constexpr size_t kBirthsKept = 256;  // births beyond it count as "elsewhere"
constexpr size_t kTrailsKept = 16;   // births beyond it keep no trail

// A storage's lineage, and a weak reference that keeps its address from being
// reused by another storage while it is a key.
struct TracedStorage {
  c10::weak_intrusive_ptr<c10::StorageImpl> keep;
  Lineage lineage;
};

// Where an autograd node came from: the forward op that made it and that op's
// module. Whatever made the node (an aten op, a custom autograd Function in
// Python or C++, a view op the capture skips), its sequence number was taken
// while a forward op or module ran on the forward's thread.
struct NodeOrigin {
  std::string op, module;
  int64_t index = -1;       // the forward op's index (for module_of); for a node no op claimed, the next op's
  bool recomputed = false;  // made by activation checkpointing's recomputation
};

// One run of a backward node by the autograd engine: its pre-hooks, the node,
// its post-hooks. The node's sequence number is known once the node starts,
// after its pre-hooks (a tensor's register_hook) ran.
struct Evaluation {
  std::string node;
  int64_t seq_nr = -1;
  // AccumulateGrad, which has no sequence number: the module of the leaf it
  // accumulates into, where the engine says which (compat::leaf_being_accumulated).
  std::string leaf_module;
};

struct CaptureState {
  std::mutex mutex;
  CaptureOptions options;
  OpOutputSink on_op_output;
  int64_t next_start = 0;
  int64_t next_end = 0;
  bool any_nonfinite = false;
  std::deque<TrailEntry> trail;   // the last ops seen
  std::vector<Candidate> births;  // every op that gave birth, by id
  // The lineage of every storage that holds a non-finite value an op made
  // (or the batch brought): which births reach what the step ended with.
  std::unordered_map<const c10::StorageImpl*, TracedStorage> lineage;
  // What the step's failed values (its loss, gradients, their norm) came
  // from; nullopt until told (note_step_result), or when none was non-finite.
  std::optional<Lineage> failure;
  std::unordered_map<int64_t, NodeOrigin> node_origins;  // by autograd seqNr
  std::vector<Evaluation> evaluations;                   // by id, in start order
  std::vector<std::string> modules_seen;                 // forward modules from scopes, first-seen order
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

  // A backward op's record named after its node's origin (forward_op, module,
  // a recomputation's site): the index of the forward op its module comes
  // from, -1 when the node's origin was not seen.
  int64_t name_backward_op(format::OpRecord& record, int64_t evaluation) const {
    if (evaluation < 0 || evaluation >= int64_t(evaluations.size())) return -1;
    const Evaluation& e = evaluations[size_t(evaluation)];
    record.seq_nr = e.seq_nr;
    const std::string function = custom_function_name(e.node);
    const auto it = e.seq_nr >= 0 ? node_origins.find(e.seq_nr) : node_origins.end();
    if (it == node_origins.end()) {
      record.forward_op = function;
      record.module = e.leaf_module;
      return -1;
    }
    record.forward_op = function.empty() ? it->second.op : function;
    record.module = it->second.module;
    if (it->second.recomputed && record.site == format::OpSite::op) record.site = format::OpSite::recomputation;
    return it->second.index;
  }
};

CaptureState* g_state = nullptr;
bool g_scopes_were_enabled = false;
bool g_installed = false;
at::CallbackHandle g_handle = 0;
uint64_t g_capture_count = 0;      // which capture a thread's bookkeeping below belongs to
std::thread::id g_capture_thread;  // the thread that runs the step's forward (the capture's maker)

// The callback's own reductions are ops too: this guard keeps it from
// recording itself.
thread_local bool t_in_callback = false;
struct ReentryGuard {
  ReentryGuard() { t_in_callback = true; }
  ~ReentryGuard() { t_in_callback = false; }
};

// The autograd work open on this thread, innermost last: an evaluation of a
// node by the engine, and inside it the node's own record (its derivative).
// An op inside an evaluation but outside its node ran in one of its hooks.
struct BackwardFrame {
  int64_t evaluation = -1;
  bool inside_node = false;
  // An evaluation whose node has run: what follows is the engine's (a
  // broadcast gradient summed to its input's shape, gradients accumulated)
  // and the node's post-hooks, the node's work; before the node, its pre-hooks.
  bool node_done = false;
  size_t scope_depth = 0;  // module scopes open when it began: one opened since is a recomputation's
};
thread_local std::vector<BackwardFrame> t_backward;
// Forward ops started and not ended on this thread, innermost last: a node no
// op claimed (a skipped view's, a custom Function's) is named by the op around it.
thread_local std::vector<std::string> t_open_forward_ops;
// Ops (not nodes) started and not ended on this thread: an op that starts at
// none is outermost, what the model's code or the engine called.
thread_local int64_t t_open_ops = 0;
// The sequence number up to which this thread's nodes have an origin.
struct ClaimedNodes {
  uint64_t capture = 0;
  int64_t up_to = 0;
};
thread_local ClaimedNodes t_claimed;

// The engine's record around each node it evaluates (hooks included):
// "autograd::engine::evaluate_function: MulBackward0".
constexpr std::string_view kEvaluatePrefix = "autograd::engine::evaluate_function: ";

// Nodes made on this thread since the last forward event and not claimed by
// the op that made them (a custom Function's node, made before its forward
// runs; a skipped view op's) belong to the module running now and the op
// around them. Called at forward ops' starts and ends, capture only.
void claim_new_nodes(CaptureState& st, const std::string& module, bool recomputed) {
  const int64_t now = int64_t(at::sequence_number::peek());
  if (t_claimed.capture != g_capture_count) {  // this thread's first event of this capture
    t_claimed = {g_capture_count, now};
    return;
  }
  for (int64_t seq = t_claimed.up_to; seq < now; ++seq)
    st.node_origins.try_emplace(seq, NodeOrigin{t_open_forward_ops.empty() ? std::string() : t_open_forward_ops.back(),
                                                module, st.next_end, recomputed});
  t_claimed.up_to = std::max(t_claimed.up_to, now);
}

// Before a module scope opens or closes: the nodes made since the last op
// were made in the module running until now (a custom Function called last in
// a module's forward, a checkpointed block's node made before the block runs).
void on_scope_change() {
  if (!g_state || t_in_callback) return;
  const bool in_backward = !t_backward.empty();
  const bool recomputing = in_backward && module_scope_depth() > t_backward.back().scope_depth;
  if (in_backward && !recomputing) return;
  std::lock_guard<std::mutex> lock(g_state->mutex);
  claim_new_nodes(*g_state, current_module_path(), recomputing);
}

struct OpContext : at::ObserverContext {
  bool is_node = false;  // an evaluation's or node's record: only its frame to pop
  bool outermost = false;
  bool forward = false;  // ran as a forward op (a recomputation's included): on t_open_forward_ops
  format::OpSite site = format::OpSite::op;
  int64_t evaluation = -1;  // a backward op's
  int64_t start_index = 0;
  std::string module;
  bool input_nan = false, input_inf = false;
  bool scalar_inf = false;           // an infinite scalar (masked_fill(x, m, -inf)) may put infinities anywhere
  std::optional<std::string> owner;  // the module whose parameter or buffer it reads (no scope open)
  // The floating inputs (in-place ops: a copy as they were at the start) and
  // scalar inputs; full statistics only if this op turns out to be a birth.
  std::vector<at::Tensor> input_tensors;
  std::vector<format::TensorStats> scalar_inputs;
  // A forward op's finite inputs that no gradient flows through (buffers, the
  // batch), read again at its end: one it wrote NaN/Inf into without returning
  // it (native_batch_norm's running_var, where a batch's variance overflows
  // while the op's output stays finite) makes the op a birth.
  std::vector<at::Tensor> written_in_place;
  int64_t counted_targets = -1;  // a loss with ignore_index: the targets it counts
  OpArity arity;                 // how many of RecordFunction's values are the op's own
  // Where its non-finite inputs' values came from, read at its start (an
  // in-place op's before it writes): what its non-finite outputs carry on.
  std::vector<at::Tensor> nonfinite_inputs;
  Lineage input_lineage;
};

// The storage a tensor's values live in, shared by its views; nullptr for a
// tensor without one.
const c10::StorageImpl* storage_key(const at::Tensor& t) {
  return t.defined() ? t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() : nullptr;
}

// The lineage of a non-finite tensor: an untraced one's values came from
// outside the ops seen.
Lineage lineage_of(const CaptureState& st, const at::Tensor& t) {
  const auto it = st.lineage.find(storage_key(t));
  if (it != st.lineage.end() && !it->second.keep.expired()) return it->second.lineage;
  Lineage outside;
  outside.from_elsewhere = true;
  return outside;
}

void set_lineage(CaptureState& st, const at::Tensor& t, Lineage lineage) {
  const c10::StorageImpl* key = storage_key(t);
  if (!key) return;
  if (lineage.births.size() > kLineageIds) lineage.births.resize(kLineageIds);
  st.lineage.insert_or_assign(
      key, TracedStorage{t.unsafeGetTensorImpl()->unsafe_storage().getWeakStorageImpl(), std::move(lineage)});
}

// A finite result that fills its whole storage holds nothing of what was there.
void clear_lineage(CaptureState& st, const at::Tensor& t) {
  if (st.lineage.empty()) return;
  const c10::StorageImpl* key = storage_key(t);
  if (key && key->nbytes() == size_t(t.numel()) * t.element_size()) st.lineage.erase(key);
}

void note_input(const c10::IValue& value, bool in_place_self, OpContext& ctx) {
  auto add_tensor = [&](const at::Tensor& t) {
    FiniteFlags f = finite_flags(t);
    ctx.input_nan |= f.nan;
    ctx.input_inf |= f.inf;
    if (f.nan || f.inf) ctx.nonfinite_inputs.push_back(t);
    ctx.input_tensors.push_back(in_place_self ? t.detach().clone() : t.detach());
    if (ctx.forward && !in_place_self && !t.requires_grad() && !f.nan && !f.inf)
      ctx.written_in_place.push_back(t.detach());
  };
  if (value.isTensor()) {
    if (is_floating(value.toTensor())) add_tensor(value.toTensor());
  } else if (value.isDouble()) {
    format::TensorStats s = scalar_stats(value.toDouble());
    ctx.input_nan |= s.nan_count > 0;
    ctx.input_inf |= s.inf_count > 0;
    ctx.scalar_inf |= s.inf_count > 0;
    ctx.input_lineage.from_elsewhere |= s.nan_count > 0 || s.inf_count > 0;  // a literal: the code's own
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
// Where: the positions of `output` that hold such a new infinity, or an
// undefined tensor where positions do not correspond.
at::Tensor new_infinities(const std::string& op, const at::Tensor& output, const std::vector<at::Tensor>& inputs) {
  if (!output.defined() || output.is_sparse() || !is_pointwise_arithmetic(op)) return {};
  for (const at::Tensor& in : inputs)
    if (in.is_sparse()) return {};  // positions of stored values do not correspond
  at::Tensor inherited = at::zeros(output.sizes(), output.options().dtype(at::kBool));
  for (const at::Tensor& in : inputs) {
    if (!broadcasts_to(in.sizes(), output.sizes())) return {};
    inherited.logical_or_(at::isinf(in.to(output.device())).expand(output.sizes()));
  }
  return at::logical_and(at::isinf(output), inherited.logical_not());
}

bool holds_new_infinity(const std::string& op, const at::Tensor& output, const std::vector<at::Tensor>& inputs) {
  const at::Tensor found = new_infinities(op, output, inputs);
  return found.defined() && found.any().item<bool>();
}

// The batch rows (positions) of `output` holding the birth's kind (NaN or
// Inf), when its first dimension is the batch and not every row went: which
// sample an internal birth came from, even where the batch cannot be
// bisected. At most 16.
// `output` may be a mask of the positions born (new_infinities): an Inf born
// beside intended ones (a causal mask's -inf in every row) is named by the
// rows where it was born, not lost among the rows that held one already.
std::vector<int64_t> nonfinite_batch_rows(const at::Tensor& output, int64_t batch_size, int64_t row_dim,
                                          format::BirthKind kind) {
  if (batch_size < 2 || output.is_sparse() || output.dim() <= row_dim || output.size(row_dim) != batch_size) return {};
  const at::Tensor rows = output.movedim(row_dim, 0).reshape({batch_size, -1});
  const at::Tensor bad = (output.scalar_type() == at::kBool ? rows
                          : kind == format::BirthKind::nan  ? at::isnan(rows)
                                                            : at::isinf(rows))
                             .any(1);
  if (bad.all().item<bool>()) return {};  // every row: not one sample's doing
  const at::Tensor found = bad.nonzero().flatten().slice(0, 0, 16).to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(found.data_ptr<int64_t>(), found.data_ptr<int64_t>() + found.numel());
}

std::unique_ptr<at::ObserverContext> node_frame(const at::RecordFunction& fn) {
  auto ctx = std::make_unique<OpContext>();
  ctx->is_node = true;
  std::lock_guard<std::mutex> lock(g_state->mutex);
  CaptureState& st = *g_state;
  if (fn.scope() == at::RecordScope::FUNCTION) {  // an evaluation: its node starts after its pre-hooks
    st.evaluations.push_back({std::string(fn.name()).substr(kEvaluatePrefix.size()), -1, {}});
    if (const std::optional<at::Tensor> leaf = compat::leaf_being_accumulated())
      st.evaluations.back().leaf_module = tensor_owner(*leaf).value_or("");
    t_backward.push_back({int64_t(st.evaluations.size()) - 1, false, false, module_scope_depth()});
    return ctx;
  }
  // The node of the evaluation around it, or one called outside the engine's evaluations.
  const bool awaited = !t_backward.empty() && !t_backward.back().inside_node &&
                       st.evaluations[size_t(t_backward.back().evaluation)].seq_nr < 0 &&
                       st.evaluations[size_t(t_backward.back().evaluation)].node == fn.name();
  if (awaited) {
    st.evaluations[size_t(t_backward.back().evaluation)].seq_nr = fn.seqNr();
  } else {
    st.evaluations.push_back({fn.name(), fn.seqNr(), {}});
  }
  t_backward.push_back(
      {awaited ? t_backward.back().evaluation : int64_t(st.evaluations.size()) - 1, true, false, module_scope_depth()});
  return ctx;
}

std::unique_ptr<at::ObserverContext> capture_on_op_start(const at::RecordFunction& fn) {
  if (t_in_callback || !g_state || inside_bookkeeping_ops()) return nullptr;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION || std::string_view(fn.name()).rfind(kEvaluatePrefix, 0) == 0)
    return node_frame(fn);
  if (fn.scope() != at::RecordScope::FUNCTION || makes_no_new_values(fn.name())) return nullptr;
  // Another thread's ops outside a backward are not the step's: a data
  // loader's workers preparing the next batches (a C++ DataLoader's threads).
  if (t_backward.empty() && std::this_thread::get_id() != g_capture_thread) return nullptr;
  ReentryGuard guard;
  at::NoGradGuard no_grad;  // no graph nodes: they would shift every later seqNr
  auto ctx = std::make_unique<OpContext>();
  ctx->outermost = t_open_ops++ == 0;
  // A module scope opened inside a backward node is a module's forward run
  // again (activation checkpointing): a forward op, named by its scope.
  const bool in_backward = !t_backward.empty();
  const bool recomputing = in_backward && module_scope_depth() > t_backward.back().scope_depth;
  ctx->forward = !in_backward || recomputing;
  if (recomputing)
    ctx->site = format::OpSite::recomputation;
  else if (in_backward)
    ctx->site = t_backward.back().inside_node || t_backward.back().node_done ? format::OpSite::op
                                                                             : format::OpSite::gradient_hook;
  if (!ctx->forward) ctx->evaluation = t_backward.back().evaluation;
  ctx->module = ctx->forward ? current_module_path() : std::string();
  {
    std::lock_guard<std::mutex> lock(g_state->mutex);
    ctx->start_index = g_state->next_start++;
    if (ctx->forward) claim_new_nodes(*g_state, ctx->module, recomputing);
  }
  if (ctx->forward) t_open_forward_ops.push_back(fn.name());
  const std::string name = fn.name();
  const bool in_place = !name.empty() && name.back() == '_';
  bool first = true;
  ctx->arity = op_arity(fn);
  const bool find_owner = ctx->module.empty() && !in_backward && any_tensor_owners();
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
  if (!ctx->nonfinite_inputs.empty()) {
    std::lock_guard<std::mutex> lock(g_state->mutex);
    for (const at::Tensor& t : ctx->nonfinite_inputs) ctx->input_lineage.add(lineage_of(*g_state, t));
    ctx->nonfinite_inputs.clear();
  }
  return ctx;
}

// A backward node's end: its frame leaves the stack.
void end_backward_node() {
  if (t_backward.empty()) return;
  const BackwardFrame ended = t_backward.back();
  t_backward.pop_back();
  if (ended.inside_node && !t_backward.empty() && t_backward.back().evaluation == ended.evaluation)
    t_backward.back().node_done = true;
}

// What an op left: its floating outputs (finite or not), the autograd nodes
// it created, and an input it made non-finite in place.
struct OpOutputs {
  bool nan = false, inf = false;   // any output, or an input written in place
  bool outputs_nonfinite = false;  // its outputs alone
  at::Tensor first;                // its first floating output
  std::vector<int64_t> created_nodes;
  std::vector<at::Tensor> finite, nonfinite;  // for their lineage
  at::Tensor written;                         // an input the op made non-finite in place, not among its outputs
  bool only_written() const { return written.defined() && !outputs_nonfinite; }
};

OpOutputs read_outputs(const at::RecordFunction& fn, const OpContext& ctx) {
  OpOutputs out;
  for (const c10::IValue& value : op_results(fn, ctx.arity)) {
    if (!value.isTensor() || !is_floating(value.toTensor())) continue;
    const at::Tensor& t = value.toTensor();
    const FiniteFlags f = finite_flags(t);
    out.nan |= f.nan;
    out.inf |= f.inf;
    (f.nan || f.inf ? out.nonfinite : out.finite).push_back(t);
    if (!out.first.defined()) out.first = t.detach();
    // Only the node this op created (its seqNr is the one peeked at its start);
    // a view or no-op such as resolve_conj returns a tensor of an older node.
    if (t.requires_grad() && t.grad_fn() && t.grad_fn()->sequence_nr() == uint64_t(fn.seqNr()))
      out.created_nodes.push_back(t.grad_fn()->sequence_nr());
  }
  out.outputs_nonfinite = out.nan || out.inf;
  for (const at::Tensor& t : ctx.written_in_place) {
    const FiniteFlags f = finite_flags(t);
    out.nan |= f.nan;
    out.inf |= f.inf;
    if ((f.nan || f.inf) && !out.written.defined()) out.written = t;
  }
  return out;
}

// The op's phase and module, and what a forward op leaves for the backward
// (the nodes it created, its module). Returns its forward index (-1: none).
int64_t place_op(CaptureState& st, format::OpRecord& record, const OpContext& ctx, const at::RecordFunction& fn,
                 const OpOutputs& out) {
  int64_t forward_index = -1;
  if (const std::optional<format::Phase> phase = current_phase_override()) {
    record.phase = *phase;
    record.module = ctx.module;
  } else if (ctx.forward) {
    record.phase = format::Phase::forward;
    record.module = ctx.module;
    record.seq_nr = fn.seqNr();
    forward_index = record.index;
    if (!record.module.empty() &&
        std::find(st.modules_seen.begin(), st.modules_seen.end(), record.module) == st.modules_seen.end())
      st.modules_seen.push_back(record.module);
    if (ctx.owner) st.owner_at[record.index] = *ctx.owner;
    // Outer ops end after the ops inside them, so the op the model called wins.
    const bool recomputed = ctx.site == format::OpSite::recomputation;
    for (int64_t seq : out.created_nodes) st.node_origins[seq] = {record.op, record.module, record.index, recomputed};
  } else {
    record.phase = format::Phase::backward;
    record.backward_node = st.evaluations[size_t(ctx.evaluation)].node;
  }
  if (ctx.forward) {
    claim_new_nodes(st, ctx.module, ctx.site == format::OpSite::recomputation);
    if (!t_open_forward_ops.empty()) t_open_forward_ops.pop_back();
  }
  return forward_index;
}

// A birth of `kind` at this op: its output's (or the input it wrote's)
// statistics, the batch rows it holds, its inputs.
format::Birth birth_at(const format::OpRecord& record, const OpOutputs& out, const OpContext& ctx,
                       const CaptureOptions& options, format::BirthKind kind) {
  format::Birth b;
  b.op = record;
  if (out.only_written()) {
    b.op.output = tensor_stats(out.written);  // no rows: a buffer has no batch dimension
  } else if (out.first.defined()) {
    b.op.output = tensor_stats(out.first);
    // Forward or backward alike: an output with the batch along its row
    // dimension names the samples (a derivative's, a hook's gradient).
    if (record.phase == format::Phase::forward || record.phase == format::Phase::backward) {
      const at::Tensor born =
          kind == format::BirthKind::inf ? new_infinities(record.op, out.first, ctx.input_tensors) : at::Tensor();
      b.rows = nonfinite_batch_rows(born.defined() ? born : out.first, options.batch_size, options.row_dim, kind);
    }
  }
  b.micro_batch = options.micro_batch;
  b.kind = kind;
  b.counted_targets = ctx.counted_targets;
  for (const at::Tensor& t : ctx.input_tensors) b.inputs.push_back(tensor_stats(t));
  for (const auto& scalar : ctx.scalar_inputs) b.inputs.push_back(scalar);
  return b;
}

void capture_on_op_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  if (!raw || !g_state) return;
  auto* ctx = static_cast<OpContext*>(raw);
  if (ctx->is_node) {
    end_backward_node();
    return;
  }
  --t_open_ops;
  ReentryGuard guard;
  at::NoGradGuard no_grad;
  const OpOutputs out = read_outputs(fn, *ctx);
  format::OpRecord record;
  record.op = fn.name();
  record.site = ctx->site;
  std::lock_guard<std::mutex> lock(g_state->mutex);
  CaptureState& st = *g_state;
  record.index = st.next_end++;
  const int64_t forward_index = place_op(st, record, *ctx, fn, out);
  st.any_nonfinite |= out.nan || out.inf;
  // A non-finite value that never leaves the op that made it is no birth: an
  // op whose output is all finite drops the births made inside it (SDPA's
  // math path takes the softmax of a fully masked row, which is NaN, and
  // zeroes it in the same op). The first birth after it is the run's. An
  // output that holds either kind keeps them: an Inf made inside (autocast's
  // cast of conv2d's input) may leave as the NaN it became.
  const bool nan_birth = out.nan && !ctx->input_nan;
  const bool inf_birth = out.inf && !ctx->input_nan &&
                         (!ctx->input_inf || (!out.only_written() && !ctx->scalar_inf &&
                                              holds_new_infinity(record.op, out.first, ctx->input_tensors)));
  for (Candidate& enclosed : st.births) {
    if (enclosed.start_index <= ctx->start_index) continue;
    const bool dropped = out.first.defined() && !out.nan && !out.inf;
    // A later-ending op that started before a birth encloses it: the op the
    // model's code called (the outer one) is reported instead.
    if (dropped || nan_birth) enclosed.nan.reset();
    if (dropped || inf_birth) enclosed.inf.reset();
  }
  st.trail.push_back({record, out.first, forward_index, ctx->evaluation});
  while (st.trail.size() > st.options.trail_length) st.trail.pop_front();

  Lineage carried = ctx->input_lineage;  // what its non-finite outputs carry on
  if ((nan_birth || inf_birth) && st.births.size() < kBirthsKept) {
    Candidate c;
    c.start_index = ctx->start_index;
    c.forward_index = forward_index;
    c.evaluation = ctx->evaluation;
    if (st.births.size() < kTrailsKept) c.trail.assign(st.trail.begin(), st.trail.end());
    if (nan_birth) c.nan = birth_at(record, out, *ctx, st.options, format::BirthKind::nan);
    if (inf_birth) c.inf = birth_at(record, out, *ctx, st.options, format::BirthKind::inf);
    carried.add_birth(int32_t(st.births.size()));
    st.births.push_back(std::move(c));
  } else if (nan_birth || inf_birth) {
    carried.from_elsewhere = true;  // a birth past the ones kept
  }
  for (const at::Tensor& t : out.nonfinite) set_lineage(st, t, carried);
  if (out.written.defined()) set_lineage(st, out.written, carried);
  for (const at::Tensor& t : out.finite) clear_lineage(st, t);
  if (ctx->outermost && out.first.defined() && st.on_op_output) {
    format::OpRecord named = record;
    const int64_t from = ctx->evaluation >= 0 ? st.name_backward_op(named, ctx->evaluation) : forward_index;
    if (from >= 0) named.module = st.module_of(from, named.module);
    st.on_op_output(named, out.first);
  }
}

}  // namespace

OpCapture::OpCapture(CaptureOptions options, OpOutputSink on_op_output) {
  if (g_installed) throw std::logic_error("only one OpCapture may be active at a time");
  g_state = new CaptureState();
  g_state->options = options;
  g_state->on_op_output = std::move(on_op_output);
  ++g_capture_count;
  g_capture_thread = std::this_thread::get_id();
  t_backward.clear();
  t_open_forward_ops.clear();
  t_open_ops = 0;
  t_claimed = {g_capture_count, int64_t(at::sequence_number::peek())};
  detail::g_scope_listener = on_scope_change;
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
  detail::g_scope_listener = nullptr;
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
  ReentryGuard guard;
  at::NoGradGuard no_grad;
  auto named = [&](format::Birth birth, const Candidate& candidate) {
    const int64_t forward_index =
        candidate.evaluation >= 0 ? st.name_backward_op(birth.op, candidate.evaluation) : candidate.forward_index;
    if (forward_index >= 0) birth.op.module = st.module_of(forward_index, birth.op.module);
    return birth;
  };
  // The births that count: those whose values reached what the step failed
  // on (its loss, a gradient, their norm), where the re-run said what that
  // was and some birth did; else every birth.
  std::vector<bool> counts(st.births.size(), true);
  if (st.failure) {
    std::vector<bool> reached(st.births.size(), false);
    bool any = false;
    for (int32_t id : st.failure->births)
      if (size_t(id) < st.births.size() && st.births[size_t(id)].any()) reached[size_t(id)] = any = true;
    if (any) counts = reached;
  }
  auto first_of = [&](auto kind) -> const Candidate* {
    const Candidate* first = nullptr;
    for (size_t id = 0; id < st.births.size(); ++id) {
      const Candidate& b = st.births[id];
      if (counts[id] && b.*kind && (!first || b.start_index < first->start_index)) first = &b;
    }
    return first;
  };
  const Candidate* first_nan = first_of(&Candidate::nan);
  const Candidate* first_inf = first_of(&Candidate::inf);
  if (first_nan) c.first_nan_birth = named(*first_nan->nan, *first_nan);
  if (first_inf) c.first_inf_birth = named(*first_inf->inf, *first_inf);
  // One op that gives birth to both is an Inf birth (docs/design.md): the NaN
  // beside an overflow is what the kernel's summation made of the infinity,
  // and whether it makes one differs between CPUs.
  const Candidate* first = first_nan;
  c.first_birth = c.first_nan_birth;
  if (c.first_inf_birth && (!c.first_nan_birth || c.first_inf_birth->op.index <= c.first_nan_birth->op.index)) {
    first = first_inf;
    c.first_birth = c.first_inf_birth;
  }
  // Earlier births whose values every later op discarded (T5's log(0) that a
  // where() drops, a mask's own arithmetic): a note, never the birth.
  for (size_t id = 0; first && id < st.births.size() && c.discarded.size() < 4; ++id) {
    const Candidate& b = st.births[id];
    const std::optional<format::Birth>& kept = b.inf ? b.inf : b.nan;
    if (!counts[id] && kept && kept->op.index < c.first_birth->op.index)
      c.discarded.push_back(format::birth_text(named(*kept, b)));
  }
  // The trail up to the birth reported. Its stats are computed now, from the
  // outputs kept (an output changed in place by a later op shows its later
  // values; the births' stats are exact).
  // With no birth, the last ops seen (a fused kernel's step).
  const std::vector<TrailEntry> last_ops(st.trail.begin(), st.trail.end());
  {
    for (const TrailEntry& entry : first ? first->trail : last_ops) {
      format::OpRecord record = entry.record;
      const int64_t forward_index =
          entry.evaluation >= 0 ? st.name_backward_op(record, entry.evaluation) : entry.forward_index;
      if (forward_index >= 0) record.module = st.module_of(forward_index, record.module);
      if (entry.output.defined()) record.output = tensor_stats(entry.output);
      c.trail.push_back(record);
    }
  }
  return c;
}

std::optional<bool> OpCapture::failure_read_batch() const {
  std::lock_guard<std::mutex> lock(g_state->mutex);
  const std::optional<Lineage>& failure = g_state->failure;
  // Values of unknown origin alone say nothing of the batch.
  if (!failure || (!failure->from_batch && failure->births.empty())) return std::nullopt;
  return failure->from_batch;
}

namespace {

// Under an active capture: `f(state, tensor)` for each defined floating
// tensor of `values` that holds a NaN/Inf, the capture's lock held.
template <class F>
void for_each_nonfinite(const std::vector<at::Tensor>& values, const F& f) {
  if (!g_state) return;
  ReentryGuard guard;
  at::NoGradGuard no_grad;
  for (const at::Tensor& t : values) {
    if (!t.defined() || !is_floating(t)) continue;
    const FiniteFlags flags = finite_flags(t);
    if (!flags.nan && !flags.inf) continue;
    std::lock_guard<std::mutex> lock(g_state->mutex);
    f(*g_state, t);
  }
}

}  // namespace

void note_step_batch(const std::vector<at::Tensor>& leaves) {
  for_each_nonfinite(leaves, [](CaptureState& st, const at::Tensor& t) {
    Lineage batch;
    batch.from_batch = true;
    set_lineage(st, t, batch);
  });
}

void note_step_result(const std::vector<at::Tensor>& values) {
  for_each_nonfinite(values, [](CaptureState& st, const at::Tensor& t) {
    const Lineage from = lineage_of(st, t);
    if (st.failure)
      st.failure->add(from);
    else
      st.failure = from;
  });
}

}  // namespace nanscope::probe
