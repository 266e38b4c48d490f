#include "nanscope/probe/batch.hpp"

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
  for (const at::Tensor& t : tensors())
    if (t.dim() > row_dim) return t.size(row_dim);
  return 0;
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

Batch Batch::copied() const {
  return with_each_tensor(*this, [](const at::Tensor& t) { return t.detach().clone(); });
}

Batch Batch::to(const at::Device& device) const {
  return with_each_tensor(*this, [&](const at::Tensor& t) { return t.to(device); });
}

Batch Batch::without_row(int64_t row) const {
  const int64_t n = rows();
  const at::Tensor keep = at::cat({at::arange(0, row, at::kLong), at::arange(row + 1, n, at::kLong)});
  Batch out = *this;
  if (is_nested()) {
    for (at::Tensor& t : out.leaves) t = cut(t, row_dim, n, keep);
  } else {
    out.inputs = cut(inputs, row_dim, n, keep);
    out.targets = cut(targets, row_dim, n, keep);
  }
  return out;
}

int64_t Batch::first_nonfinite_row() const {
  const int64_t n = rows();
  int64_t first = -1;
  for (const at::Tensor& t : tensors()) {
    if (!t.is_floating_point() || !has_rows(t, row_dim, n) || t.numel() == 0) continue;
    const at::Tensor bad = at::logical_not(at::isfinite(t.detach()).movedim(row_dim, 0).reshape({n, -1}).all(1));
    const at::Tensor found = bad.nonzero();
    if (found.numel() > 0) {
      const int64_t row = found[0][0].item<int64_t>();
      if (first < 0 || row < first) first = row;
    }
  }
  return first;
}

at::Tensor Batch::row_of(int64_t row) const {
  const int64_t n = rows();
  for (const at::Tensor& t : tensors())
    if (t.is_floating_point() && has_rows(t, row_dim, n) && !at::isfinite(t.select(row_dim, row)).all().item<bool>())
      return t.select(row_dim, row);
  return {};
}

}  // namespace nanscope
