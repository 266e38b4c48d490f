#include "nanscope/core/step_replay.hpp"

#include <algorithm>
#include <cmath>

#include "nanscope/common/error_text.hpp"
#include "nanscope/core/optimizer.hpp"
#include "nanscope/core/train_step.hpp"
#include "nanscope/format/row_text.hpp"
#include "nanscope/probe/tensor_io.hpp"

namespace nanscope {

namespace {
constexpr double kNoBand = std::numeric_limits<double>::infinity();
}  // namespace

LiveEarlierSteps::LiveEarlierSteps(TrainableModel& model, torch::optim::Optimizer& optimizer,
                                   const std::vector<at::Tensor>& parameters, double clip, const TrainingState& from,
                                   std::vector<const StepRecord*> steps, const StepRecord& failing, double loss_band)
    : model_(model),
      optimizer_(optimizer),
      parameters_(parameters),
      clip_(clip),
      from_(from),
      steps_(std::move(steps)),
      failing_(failing),
      loss_band_(loss_band) {}

std::vector<int64_t> LiveEarlierSteps::applied_steps() const {
  std::vector<int64_t> out;
  for (const StepRecord* r : steps_)
    if (r->applied) out.push_back(r->step);
  return out;
}

std::string dooming_rows_text(const StepRecord* record, const std::vector<int64_t>& rows) {
  if (rows.empty()) return "its update";
  std::vector<int64_t> batch_rows = record ? probe::long_values(record->batch_rows) : std::vector<int64_t>{};
  if (batch_rows.empty()) batch_rows.assign(size_t(rows.back() + 1), -1);
  return format::batch_rows_text(batch_rows, rows);
}

std::vector<MicroBatch> without_rows(const std::vector<MicroBatch>& micro_batches, const std::vector<int64_t>& rows) {
  std::vector<MicroBatch> out;
  int64_t offset = 0;
  for (const MicroBatch& micro : micro_batches) {
    const int64_t n = micro.batch.rows();
    MicroBatch kept = micro;
    // Highest first, so the rows still to remove keep their positions.
    for (auto it = rows.rbegin(); it != rows.rend(); ++it)
      if (*it >= offset && *it < offset + n) kept.batch = kept.batch.without_row(*it - offset);
    if (kept.batch.rows() > 0) out.push_back(std::move(kept));
    offset += n;
  }
  return out;
}

bool LiveEarlierSteps::run(const StepRecord& record, const std::vector<int64_t>& rows_left_out, bool update,
                           double loss_band) {
  ++steps_run_;
  const std::vector<int64_t> own = ranks_ ? own_rows(rows_left_out) : rows_left_out;
  std::vector<MicroBatch> micro = own.empty() ? record.micro_batches : without_rows(record.micro_batches, own);
  if (micro.empty()) {
    // Every row of this rank's batch left out: its peers still run the step
    // (a sharded model's forward waits for each rank), so it runs its batch
    // weighted 0, which adds nothing to the averaged gradients (the step was
    // applied: its losses are finite).
    micro = record.micro_batches;
    for (MicroBatch& m : micro) m.loss_weight = 0.0;
  }
  bool ok = false;
  try {
    const StepRecomputation r = recompute_step(model_, parameters_, record.amp, record.loss_scale, record.setup, micro);
    ok = r.finite() && r.loss.item<double>() <= loss_band;
    double norm = ranks_ ? 0.0 : r.total_norm.item<double>();
    if (ranks_) ok = across_ranks(ok, norm);
    if (ok && update) {
      clip_gradients(parameters_, norm, clip_);
      GroupLrScope as_recorded(optimizer_);
      as_recorded.set(record.lrs);
      optimizer_.step();
    }
  } catch (const std::exception& e) {
    // A sharded replay's peers wait in its forward's and backward's
    // collectives: no going on without this rank (the guard stops the run).
    if (ranks_ && ranks_->sharded()) throw;
    last_error_ = one_line_error(e);
    ok = false;  // an op that raised on the values a replay made: no survival
    double unused = 0;
    if (ranks_) across_ranks(false, unused);  // the peers wait for this rank's verdict
  }
  clear_grads(parameters_);
  return ok;
}

bool LiveEarlierSteps::across_ranks(bool ok, double& norm) {
  at::NoGradGuard no_grad;
  auto squares = [&] {  // of this rank's gradients
    at::Tensor sum = at::zeros({}, at::kDouble);
    for (const at::Tensor& p : parameters_)
      if (p.grad().defined()) sum += p.grad().to(at::kDouble).square().sum();
    return sum;
  };
  if (!ranks_->sharded()) {
    // Data parallel: the gradients averaged as the step did, the flag (summed) with them.
    at::Tensor bad = at::full({1}, ok ? 0.0f : 1.0f);
    ranks_->average(bad);
    if (bad.item<float>() != 0.0f) return false;
    norm = std::sqrt(squares().item<double>());
    return true;
  }
  // Sharded: the backward reduced the gradients; each rank holds a shard of each.
  at::Tensor both = at::stack({at::full({}, ok ? 0.0 : 1.0, at::kDouble), squares()});
  ranks_->sum(both);
  norm = std::sqrt(both[1].item<double>());
  return both[0].item<double>() == 0.0;
}

bool LiveEarlierSteps::budget_left() const { return budget_ - steps_run_ >= int64_t(steps_.size()) + 1; }

bool LiveEarlierSteps::reproduce(const std::function<void(const StepRecord&)>& before) {
  LossScaler scaler;
  StateRing::restore(from_, model_, optimizer_, scaler);
  for (const StepRecord* r : steps_) {
    before(*r);
    // A step the run applied must be finite again (its loss may have been a spike the run let through).
    if (!run(*r, {}, /*update=*/r->applied, kNoBand) && r->applied) return false;
  }
  before(failing_);
  return !run(failing_, {}, /*update=*/false, kNoBand);
}

bool LiveEarlierSteps::survives(const LeaveOut& leave_out) {
  if (on_replay_) on_replay_(leave_out);
  LossScaler scaler;  // replays use each step's recorded loss scale; the guard's scaler is left alone
  StateRing::restore(from_, model_, optimizer_, scaler);
  for (const StepRecord* r : steps_) {
    if (!r->applied) continue;  // skipped then: skipped now
    const bool in_range = r->step >= leave_out.first && r->step <= leave_out.last;
    if (in_range && leave_out.rows.empty()) continue;
    if (!run(*r, in_range ? leave_out.rows : std::vector<int64_t>{}, /*update=*/true, loss_band_)) return false;
  }
  return run(failing_, {}, /*update=*/false, loss_band_);
}

int64_t LiveEarlierSteps::searchable_rows(int64_t step) const {
  const auto it = std::find_if(steps_.begin(), steps_.end(), [&](const StepRecord* r) { return r->step == step; });
  const int64_t own = it == steps_.end() ? 0 : own_searchable_rows(**it);
  if (!ranks_) return own;
  // Every rank's count, in one sum: a row is searched only where every rank's can be.
  const int world = ranks_->world_size();
  at::Tensor counts = at::zeros({world}, at::kDouble);
  counts.data_ptr<double>()[ranks_->rank()] = double(own);
  ranks_->sum(counts);
  rank_offsets_.assign(1, 0);
  for (int r = 0; r < world; ++r) {
    const int64_t rows = int64_t(counts.data_ptr<double>()[r]);
    if (rows == 0) {
      rank_offsets_.clear();
      return 0;
    }
    rank_offsets_.push_back(rank_offsets_.back() + rows);
  }
  return rank_offsets_.back();
}

int64_t LiveEarlierSteps::own_searchable_rows(const StepRecord& record) const {
  int64_t rows = 0;
  for (const MicroBatch& m : record.micro_batches) rows += m.batch.rows();
  // A step that draws random numbers (dropout) would draw them differently
  // without a row: removing one could "save" it by luck.
  for (const MicroBatch& m : record.micro_batches) {
    if (!m.cpu_rng_state.known()) continue;
    recompute_step(model_, parameters_, record.amp, record.loss_scale, record.setup, std::vector<MicroBatch>{m});
    clear_grads(parameters_);
    if (!m.cpu_rng_state.is_current()) return 0;
  }
  return rows;
}

std::vector<int64_t> LiveEarlierSteps::own_rows(const std::vector<int64_t>& rows_left_out) const {
  std::vector<int64_t> own;
  if (rows_left_out.empty() || rank_offsets_.empty()) return own;
  const int rank = ranks_->rank();
  for (int64_t row : rows_left_out)
    if (row >= rank_offsets_[rank] && row < rank_offsets_[rank + 1]) own.push_back(row - rank_offsets_[rank]);
  return own;
}

std::string LiveEarlierSteps::rows_text(const StepRecord* record, const std::vector<int64_t>& rows,
                                        bool data_set_rows) const {
  if (!ranks_ || rows.empty() || rank_offsets_.empty()) return dooming_rows_text(record, rows);
  auto plain = [](const std::vector<int64_t>& batch_rows) {
    std::string list;
    for (int64_t row : batch_rows) list += (list.empty() ? "" : ", ") + std::to_string(row);
    return (batch_rows.size() == 1 ? "batch row " : "batch rows ") + list;
  };
  std::string text;
  for (size_t r = 0; r + 1 < rank_offsets_.size(); ++r) {
    std::vector<int64_t> theirs;
    for (int64_t row : rows)
      if (row >= rank_offsets_[r] && row < rank_offsets_[r + 1]) theirs.push_back(row - rank_offsets_[r]);
    if (theirs.empty()) continue;
    // The data set rows are known to the rank that read them.
    const bool own = data_set_rows && int(r) == ranks_->rank();
    text += (text.empty() ? "" : " and ") + std::string("rank ") + std::to_string(r) + "'s " +
            (own ? dooming_rows_text(record, theirs) : plain(theirs));
  }
  return text;
}

}  // namespace nanscope
