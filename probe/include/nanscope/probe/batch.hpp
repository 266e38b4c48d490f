#pragma once
// A step's batch, or one micro-batch of it, as the guard checks, snapshots,
// re-runs and bisects it. Two shapes:
//  - the pair (inputs, targets) a C++ loop or nanoscope-train has (targets
//    may be undefined when the loss function holds them);
//  - any nested structure of tensors (a dict of input_ids, attention_mask and
//    labels; a tuple holding an RNN's hidden state), given as its tensors in
//    order (`leaves`) and a description of how they nest (`structure`, opaque
//    here: written into snapshots and handed back to the code that made it,
//    e.g. the Python module).
// Samples lie along `row_dim` of every tensor that has it at the batch's size
// (1 for (seq, batch) data: rows are samples, never time steps). A nested
// batch's tensors may each lie otherwise (an LSTM's carried state is
// (layers, batch, hidden) beside (batch, seq) data): `leaf_row_dims` declares
// each one's, and a tensor without one whose row_dim is not at the batch's
// size has its rows found along the one dimension that is (two such
// dimensions are ambiguous: refused, naming the tensor, when a row is cut).
// A 1-D tensor whose length is a multiple of the rows is a flattened target,
// laid out (rows, m), or (m, rows) with row_dim 1, and cut so; any other
// tensor without a dimension at the batch's size (a scalar) is not cut.
// A batch given as lists of per-sample items (torchvision's detection: images
// a list of (3, H, W) tensors, targets a list of dicts of boxes and labels)
// has its samples along those lists: the item's index is the row, and a row
// is replaced by another item's tensors, never cut (sample_lists()).
#include <ATen/ATen.h>
#include <torch/data/example.h>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nanscope/probe/cpu_rng_state.hpp"

namespace nanscope {

struct Batch {
  at::Tensor inputs, targets;
  std::vector<at::Tensor> leaves;  // a nested batch's tensors (then inputs/targets are unused)
  std::string structure;           // how the leaves nest; "" for (inputs, targets)
  int64_t row_dim = 0;
  // Per leaf of a nested batch: the dimension its samples lie along, or
  // kFindRows; empty: kFindRows for every leaf.
  std::vector<int64_t> leaf_row_dims;
  static constexpr int64_t kFindRows = -1;

  Batch() = default;
  Batch(at::Tensor inputs_, at::Tensor targets_ = {}) : inputs(std::move(inputs_)), targets(std::move(targets_)) {}
  Batch(const torch::data::Example<>& example) : Batch(example.data, example.target) {}
  static Batch nested(std::vector<at::Tensor> leaves, std::string structure, int64_t row_dim = 0);
  // A C++ loop's batch of several tensors (data, targets, a carried state),
  // held as a tuple; `row_dims` per tensor (kFindRows, or empty: found).
  static Batch of(std::vector<at::Tensor> tensors, std::vector<int64_t> row_dims = {});

  bool is_nested() const { return !structure.empty(); }
  bool empty() const { return tensors().empty(); }
  // Every tensor of the batch, defined ones only, in order.
  std::vector<at::Tensor> tensors() const;
  // The number of samples: the size along row_dim of the first tensor that
  // has that dimension; 0 when none has.
  int64_t rows() const;
  // The same batch with its own copy of every tensor (detached from the
  // loop's graph, requiring grad where the loop's did): what a loop's later
  // in-place writes (a refilled label or staging buffer) cannot change.
  // `spares`: copies of an earlier batch; one that nothing else holds any
  // more and is laid out alike takes the values in place and leaves the list
  // (a clean step's copy then allocates nothing: a large allocation per step
  // costs a small step more than the copy).
  Batch copied(std::vector<at::Tensor>* spares = nullptr) const;
  // The same batch with every tensor on `device` (those already there shared).
  Batch to(const at::Device& device) const;
  // The same batch with its bfloat16 and float16 tensors in float32 (exactly:
  // every 16-bit value is a float32 one), the rest shared.
  Batch widened() const;
  // The same batch without sample `row`, cut from every tensor whose row_dim
  // has the batch's size.
  Batch without_row(int64_t row) const;
  // The same batch with sample `row` replaced by a copy of sample `by` in
  // every tensor that holds rows: every shape stays, so a step that draws
  // random numbers (dropout) draws the same ones, which removing a row would shift.
  Batch with_row_replaced(int64_t row, int64_t by) const;
  // Every tensor that holds the batch's rows with rows `keep` (in that order).
  Batch rows_taken(const at::Tensor& keep) const;
  // The first sample holding a NaN/Inf in a floating tensor, or -1; and that
  // sample's values in the first such tensor (for the input birth's statistics).
  int64_t first_nonfinite_row() const;
  at::Tensor row_of(int64_t row) const;
  // The rows among `candidates` whose largest floating magnitude (over every
  // floating tensor that holds rows) is over `factor` times the median of
  // the other rows': samples out of the batch's range. Integer tensors (ids,
  // labels) are not read. Empty for a batch of fewer than 3 rows.
  std::vector<int64_t> rows_out_of_range(const std::vector<int64_t>& candidates, double factor) const;
  // A hash of sample `row`'s shape and values (up to 4096 of them per tensor,
  // evenly spread) in every tensor that holds rows: the same sample met in
  // another batch (a rollout's minibatches, a batch trained on again) has the
  // same one; 0 for a row out of bounds.
  uint64_t row_fingerprint(int64_t row) const;
  // The dimension tensor `t` (leaf `leaf` of a nested batch, -1 otherwise)
  // holds the batch's `rows` samples along; -1 when it holds none. Throws
  // std::invalid_argument, naming the tensor, when two dimensions could be.
  int64_t row_dim_of(const at::Tensor& t, int64_t leaf, int64_t rows) const;
  // Why the rows of one of its tensors cannot be told apart (row_dim_of's
  // message for the first tensor that holds them along two dimensions alike),
  // or "": what the row search needs declared.
  std::string ambiguous_rows() const;
  // A nested batch's tensors' names, from its structure: a dict's key names
  // its value, positions are [i] ("pixel_values", "[0]", "encoder.input_ids");
  // empty for an (inputs, targets) batch.
  std::vector<std::string> leaf_names() const;
  // The name of the first tensor whose sample `row` holds a NaN/Inf (as
  // row_of finds it); "" unnamed.
  std::string nonfinite_tensor_name(int64_t row) const;

  // The batch's lists of per-sample items, read from its structure: `rows`
  // items each (0: none), and for each leaf its {list, item, place among
  // the item's leaves} ({-1, -1, -1}: not in one).
  struct SampleLists {
    int64_t rows = 0;
    std::vector<std::array<int64_t, 3>> item_of_leaf;
    std::vector<std::vector<std::vector<int64_t>>> items;  // per list, per item: its leaves
    std::string structure;                                 // what it was read from
    size_t leaves = 0;
  };
  SampleLists sample_lists() const;
  // The sample a leaf is one item of, or -1.
  int64_t sample_of_leaf(size_t leaf) const;

 private:
  mutable std::shared_ptr<const SampleLists> sample_lists_;  // read once per structure
};

// Where a loop wrote into a micro-batch's tensors in place, as a re-run of it sees.
enum class InPlaceWrite {
  none,
  since_call,      // between the model call and the backward
  since_backward,  // after the backward, where the guard kept the loop's own tensors
};

// One micro-batch of a step with gradient accumulation: the batch, the CPU
// generator's state when its forward began (dropout draws the same numbers on a
// re-run), and what the loop multiplied its loss by before backward (1 /
// accumulation steps, as nanoGPT does), so a re-run's gradients are the step's.

struct MicroBatch {
  Batch batch;
  CpuRngState cpu_rng_state;  // none known: the generator as it is
  double loss_weight = 1.0;
  // The loss the loop backpropagated for it (a watched step): a re-run whose
  // loss function gives an unweighted loss is weighted to match it. NaN: unknown.
  double recorded_loss = std::numeric_limits<double>::quiet_NaN();
  // The loop wrote into its tensors in place where the kept batch could not
  // hold the forward's values: a re-run sees the new ones.
  InPlaceWrite written = InPlaceWrite::none;
};

}  // namespace nanscope
