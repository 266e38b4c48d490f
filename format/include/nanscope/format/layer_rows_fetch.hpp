#pragma once
// Rows of a long run's per-layer tables, read behind the caller's back: a
// forked child reads the steps and per-layer values of rows [from, to) into
// memory shared with the caller, under the bounds every reader's rehearsal
// has (docs/format.md), while the caller polls and goes on drawing. A corrupt
// file fails the child, never the caller; the rows are read once, not
// rehearsed and read again. The viewer's zoomed-in window of a long run.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nanscope::format {

struct LayerRows {
  size_t from = 0, layers = 0;    // the first row's index; values per row
  std::vector<int64_t> step;      // one per row
  std::vector<float> grad_norm;   // [rows x layers]; empty when not asked for
  std::vector<float> act_absmax;  // likewise
  size_t rows() const { return step.size(); }
  size_t to() const { return from + rows(); }
};

class LayerRowsFetch {
 public:
  // Starts reading rows [from, to) of run file `path` (which has `layers`
  // layers; `grad`, `act`: which tables to read). With the readers'
  // rehearsal off (set_rehearsal), reads here and now.
  LayerRowsFetch(const std::string& path, size_t from, size_t to, size_t layers, bool grad, bool act);
  ~LayerRowsFetch();  // stops a read still running
  LayerRowsFetch(const LayerRowsFetch&) = delete;
  LayerRowsFetch& operator=(const LayerRowsFetch&) = delete;

  // Never blocks: true once the rows are read (take them). Throws
  // FormatError naming the file when the read failed or the file is corrupt.
  bool ready();
  LayerRows take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanscope::format
