#include "nanscope/probe/batch.hpp"

#include <algorithm>
#include <stdexcept>

#include "nanscope/probe/float_types.hpp"
#include "nanscope/probe/host_copy.hpp"

namespace nanscope {

namespace {

bool has_rows(const at::Tensor& t, int64_t row_dim, int64_t rows) {
  return t.defined() && t.dim() > row_dim && t.size(row_dim) == rows;
}

// A 1-D tensor whose length is a multiple of the rows is a flattened target
// (word_language_model's targets.view(-1) of (seq, batch) data, a (batch,
// seq) target flattened for cross_entropy): laid out as (rows, m), or (m,
// rows) when rows lie along dimension 1.
bool is_flattened_rows(const at::Tensor& t, int64_t row_dim, int64_t rows) {
  return t.defined() && t.dim() == 1 && row_dim <= 1 && rows > 0 && t.numel() > 0 && t.numel() % rows == 0;
}

at::Tensor cut(const at::Tensor& t, int64_t row_dim, int64_t rows, const at::Tensor& keep) {
  if (has_rows(t, row_dim, rows)) return t.index_select(row_dim, keep.to(t.device()));
  if (!is_flattened_rows(t, row_dim, rows)) return t;
  const int64_t m = t.numel() / rows;
  const at::Tensor laid_out = row_dim == 0 ? t.reshape({rows, m}) : t.reshape({m, rows});
  return laid_out.index_select(row_dim, keep.to(t.device())).reshape({-1});
}

}  // namespace

Batch Batch::nested(std::vector<at::Tensor> leaves, std::string structure, int64_t row_dim) {
  Batch b;
  b.leaves = std::move(leaves);
  b.structure = std::move(structure);
  b.row_dim = row_dim;
  return b;
}

Batch Batch::of(std::vector<at::Tensor> tensors, std::vector<int64_t> row_dims) {
  if (!row_dims.empty() && row_dims.size() != tensors.size())
    throw std::invalid_argument("Batch::of: " + std::to_string(row_dims.size()) + " row dimensions for " +
                                std::to_string(tensors.size()) + " tensors");
  std::string structure = R"({"u": [)";  // a tuple, as the Python side writes one (nanscope/_batch.py)
  for (size_t i = 0; i < tensors.size(); ++i)
    structure += (i ? ", " : "") + std::string(R"({"t": )") + std::to_string(i) + "}";
  Batch b = nested(std::move(tensors), structure + "]}");
  b.leaf_row_dims = std::move(row_dims);
  return b;
}

std::vector<at::Tensor> Batch::tensors() const {
  std::vector<at::Tensor> out;
  if (is_nested()) {
    for (const at::Tensor& t : leaves)
      if (t.defined()) out.push_back(t);
    return out;
  }
  if (inputs.defined()) out.push_back(inputs);
  if (targets.defined()) out.push_back(targets);
  return out;
}

int64_t Batch::rows() const {
  // A dimension declared for a tensor says the batch's size first.
  for (size_t i = 0; i < leaf_row_dims.size() && i < leaves.size(); ++i)
    if (leaf_row_dims[i] >= 0 && leaves[i].defined() && leaves[i].dim() > leaf_row_dims[i])
      return leaves[i].size(leaf_row_dims[i]);
  if (const int64_t items = sample_lists().rows; items > 0) return items;
  for (const at::Tensor& t : tensors())
    if (t.dim() > row_dim) return t.size(row_dim);
  return 0;
}

int64_t Batch::sample_of_leaf(size_t leaf) const {
  if (!is_nested() || leaf >= leaves.size()) return -1;
  return sample_lists().item_of_leaf.at(leaf)[1];
}

int64_t Batch::row_dim_of(const at::Tensor& t, int64_t leaf, int64_t rows) const {
  if (!t.defined() || rows <= 0) return -1;
  if (leaf >= 0 && sample_of_leaf(size_t(leaf)) >= 0) return -1;  // one sample's own tensor: no rows in it
  if (leaf >= 0 && size_t(leaf) < leaf_row_dims.size() && leaf_row_dims[size_t(leaf)] >= 0) {
    const int64_t declared = leaf_row_dims[size_t(leaf)];
    return t.dim() > declared && t.size(declared) == rows ? declared : -1;
  }
  if (t.dim() > row_dim && t.size(row_dim) == rows) return row_dim;
  std::vector<int64_t> candidates;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) == rows) candidates.push_back(d);
  if (candidates.size() <= 1) return candidates.empty() ? -1 : candidates.front();
  std::string name = leaf >= 0 ? leaf_names().at(size_t(leaf)) : std::string();
  if (name.empty()) name = leaf >= 0 ? "[" + std::to_string(leaf) + "]" : "inputs or targets";
  std::string shape, dims;
  for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? ", " : "") + std::to_string(t.size(d));
  for (size_t i = 0; i < candidates.size(); ++i) dims += (i ? " and " : "") + std::to_string(candidates[i]);
  throw std::invalid_argument("the batch's tensor " + name + " of shape (" + shape + ") holds the batch's " +
                              std::to_string(rows) + " samples along dimension " + dims +
                              " alike: say which (row_dims; Python: row_dim={'" + name + "': dim})");
}

// The same batch with `f` applied to each of its defined tensors.
template <class F>
Batch with_each_tensor(const Batch& batch, const F& f) {
  auto apply = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  Batch out = batch;
  if (batch.is_nested()) {
    for (at::Tensor& t : out.leaves) t = apply(t);
  } else {
    out.inputs = apply(batch.inputs);
    out.targets = apply(batch.targets);
  }
  return out;
}

namespace {

// A spare can take `t`'s values in place when nothing but the spares holds it
// (no view, no autograd record, no weak reference) and it is laid out as `t`.
bool takes_in_place(const at::Tensor& spare, const at::Tensor& t) {
  return spare.defined() && spare.use_count() == 1 && spare.weak_use_count() == 1 && spare.storage().use_count() == 1 &&
         spare.storage_offset() == 0 && !t.requires_grad() && spare.scalar_type() == t.scalar_type() &&
         spare.device() == t.device() && spare.sizes() == t.sizes() && spare.strides() == t.strides() &&
         t.is_non_overlapping_and_dense();
}

}  // namespace

Batch Batch::copied(std::vector<at::Tensor>* spares) const {
  return with_each_tensor(*this, [&](const at::Tensor& t) {
    if (spares)
      for (auto it = spares->begin(); it != spares->end(); ++it)
        if (takes_in_place(*it, t)) {
          at::Tensor copy = std::move(*it);
          spares->erase(it);
          probe::copy_into(copy, t);  // t requires no grad (takes_in_place)
          return copy;
        }
    // A tensor that required grad keeps requiring it: reentrant activation
    // checkpointing and input-gradient methods need it on re-run as the loop had it.
    at::Tensor copy = t.detach().clone();
    return t.requires_grad() ? copy.requires_grad_(true) : copy;
  });
}

Batch Batch::to(const at::Device& device) const {
  return with_each_tensor(*this, [&](const at::Tensor& t) { return t.to(device); });
}

Batch Batch::widened() const {
  return with_each_tensor(
      *this, [](const at::Tensor& t) { return probe::is_16bit_float(t.scalar_type()) ? t.to(at::kFloat) : t; });
}

Batch Batch::without_row(int64_t row) const {
  const int64_t n = rows();
  return rows_taken(at::cat({at::arange(0, row, at::kLong), at::arange(row + 1, n, at::kLong)}));
}

Batch Batch::with_row_replaced(int64_t row, int64_t by) const {
  const int64_t n = rows();
  if (row < 0 || row >= n || by < 0 || by >= n)
    throw std::invalid_argument("Batch::with_row_replaced: rows " + std::to_string(row) + " and " + std::to_string(by) +
                                " of a batch of " + std::to_string(n));
  at::Tensor index = at::arange(0, n, at::kLong);
  index[row] = by;
  return rows_taken(index);
}

// Every tensor that holds the batch's rows with rows `keep` (in that order).
Batch Batch::rows_taken(const at::Tensor& keep) const {
  const int64_t n = rows();
  const SampleLists lists = sample_lists();
  if (lists.rows > 0 && keep.numel() != n)
    throw std::invalid_argument(
        "a batch of per-sample items (lists of tensors or dicts) keeps its length: a row is replaced by a copy of "
        "another, not removed");
  auto cut_one = [&](const at::Tensor& t, int64_t leaf) {
    const int64_t dim = row_dim_of(t, leaf, n);
    if (dim >= 0) return t.index_select(dim, keep.to(t.device()));
    return cut(t, row_dim, n, keep);  // a flattened target, or a tensor without rows (left as it is)
  };
  Batch out = *this;
  if (is_nested()) {
    const at::Tensor taken = keep.to(at::kCPU, at::kLong).contiguous();
    for (size_t i = 0; i < out.leaves.size(); ++i) {
      const auto [list, item, place] = lists.rows > 0 ? lists.item_of_leaf[i] : std::array<int64_t, 3>{-1, -1, -1};
      if (list < 0) {
        out.leaves[i] = cut_one(leaves[i], int64_t(i));
        continue;
      }
      // One sample's own tensor: the same place in the item taken there.
      const std::vector<int64_t>& from = lists.items[size_t(list)][size_t(taken[item].item<int64_t>())];
      if (size_t(place) < from.size()) out.leaves[i] = leaves[size_t(from[size_t(place)])];
    }
  } else {
    out.inputs = cut_one(inputs, -1);
    out.targets = cut_one(targets, -1);
  }
  return out;
}

// Each defined floating tensor (or every defined tensor) that has the
// batch's rows, with its row dimension.
template <class F>
void for_each_with_rows(const Batch& batch, int64_t rows, const F& f, bool floating_only = true) {
  auto visit = [&](const at::Tensor& t, int64_t leaf) {
    if (!t.defined() || (floating_only && !t.is_floating_point()) || t.numel() == 0) return;
    int64_t dim = -1;
    try {
      dim = batch.row_dim_of(t, leaf, rows);
    } catch (const std::invalid_argument&) {
      dim = -1;  // which of its dimensions holds the rows is the row search's question, not this one's
    }
    if (dim >= 0) f(t, dim);
  };
  if (batch.is_nested()) {
    for (size_t i = 0; i < batch.leaves.size(); ++i) visit(batch.leaves[i], int64_t(i));
  } else {
    visit(batch.inputs, -1);
    visit(batch.targets, -1);
  }
}

int64_t Batch::first_nonfinite_row() const {
  const int64_t n = rows();
  int64_t first = -1;
  // A list item's tensor is its sample's.
  for (size_t i = 0; i < leaves.size(); ++i) {
    const int64_t sample = sample_of_leaf(i);
    if (sample >= 0 && (first < 0 || sample < first) && leaves[i].is_floating_point() &&
        !at::isfinite(leaves[i]).all().item<bool>())
      first = sample;
  }
  for_each_with_rows(*this, n, [&](const at::Tensor& t, int64_t dim) {
    const at::Tensor bad = at::logical_not(at::isfinite(t.detach()).movedim(dim, 0).reshape({n, -1}).all(1));
    const at::Tensor found = bad.nonzero();
    if (found.numel() > 0) {
      const int64_t row = found[0][0].item<int64_t>();
      if (first < 0 || row < first) first = row;
    }
  });
  return first;
}

at::Tensor Batch::row_of(int64_t row) const {
  at::Tensor found;
  for (size_t i = 0; i < leaves.size() && !found.defined(); ++i)
    if (sample_of_leaf(i) == row && leaves[i].is_floating_point() && !at::isfinite(leaves[i]).all().item<bool>())
      found = leaves[i];
  for_each_with_rows(*this, rows(), [&](const at::Tensor& t, int64_t dim) {
    if (!found.defined() && !at::isfinite(t.select(dim, row)).all().item<bool>()) found = t.select(dim, row);
  });
  return found;
}

std::string Batch::ambiguous_rows() const {
  const int64_t n = rows();
  auto why = [&](const at::Tensor& t, int64_t leaf) -> std::string {
    try {
      row_dim_of(t, leaf, n);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  if (is_nested()) {
    for (size_t i = 0; i < leaves.size(); ++i)
      if (std::string w = why(leaves[i], int64_t(i)); !w.empty()) return w;
    return "";
  }
  std::string w = why(inputs, -1);
  return w.empty() ? why(targets, -1) : w;
}

std::vector<int64_t> Batch::rows_out_of_range(const std::vector<int64_t>& candidates, double factor) const {
  const int64_t n = rows();
  std::vector<int64_t> out;
  if (n < 3 || candidates.empty()) return out;  // no "rest of the batch" to compare with
  at::Tensor largest = at::zeros({n}, at::kDouble);
  for_each_with_rows(*this, n, [&](const at::Tensor& t, int64_t dim) {
    const at::Tensor per_row = t.detach().abs().movedim(dim, 0).reshape({n, -1}).amax(1).to(at::kCPU, at::kDouble);
    largest = at::maximum(largest, per_row);
  });
  const double* m = largest.data_ptr<double>();
  for (int64_t row : candidates) {
    if (row < 0 || row >= n) continue;
    std::vector<double> others;
    for (int64_t r = 0; r < n; ++r)
      if (r != row) others.push_back(m[r]);
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    const double median = others[others.size() / 2];
    if (median > 0 && m[row] > factor * median) out.push_back(row);
  }
  return out;
}

namespace {
constexpr int64_t kFingerprintElements = 4096;
}  // namespace

uint64_t Batch::row_fingerprint(int64_t row) const {
  // FNV-1a over each tensor's sample `row`, its bytes and its shape.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  };
  const int64_t n = rows();
  if (row < 0 || row >= n) return 0;
  auto mix_sample = [&](at::Tensor sample) {
    for (int64_t size : sample.sizes()) mix(&size, sizeof size);
    // At most kFingerprintElements of it, evenly spread: a bound on a failed
    // step's cost however large the samples, and still a sample's identity.
    sample = sample.reshape({-1});
    if (sample.numel() > kFingerprintElements)
      sample = sample.index_select(0, at::linspace(0, double(sample.numel() - 1), kFingerprintElements, at::kDouble)
                                          .to(at::kLong)
                                          .to(sample.device()));
    sample = sample.contiguous().to(at::kCPU);
    mix(sample.data_ptr(), size_t(sample.nbytes()));
  };
  for_each_with_rows(
      *this, n, [&](const at::Tensor& t, int64_t dim) { mix_sample(t.detach().select(dim, row)); },
      /*floating_only=*/false);
  for (size_t i = 0; i < leaves.size(); ++i)  // a list item's tensors are its sample's
    if (sample_of_leaf(i) == row && leaves[i].defined()) mix_sample(leaves[i].detach());
  return hash;
}

}  // namespace nanscope
