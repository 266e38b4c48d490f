#include "nanscope/probe/batch.hpp"

namespace nanscope {

namespace {

bool has_rows(const at::Tensor& t, int64_t row_dim, int64_t rows) {
  return t.defined() && t.dim() > row_dim && t.size(row_dim) == rows;
}

at::Tensor cut(const at::Tensor& t, int64_t row_dim, int64_t rows, const at::Tensor& keep) {
  return has_rows(t, row_dim, rows) ? t.index_select(row_dim, keep.to(t.device())) : t;
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
