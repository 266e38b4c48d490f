#pragma once
// A run's overview: per block of consecutive rows, what a screen needs of
// each series (its smallest and largest finite value, its last value, and how
// many values were NaN and how many infinite), at a few block sizes. The run
// writes it as it writes rows (/overview in run.h5, format 1.12), so a viewer
// or a report opens a million-step run by reading a few thousand blocks, and
// a NaN anywhere in a block shows in that block at every size: nothing is
// sampled away. A file without it (older, or resumed from an older one) gets
// it built from its rows (build_overview), the same code.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nanscope/format/run_file.hpp"

namespace nanscope::format {

// Rows per block at each level, finest first.
inline constexpr std::array<int64_t, 3> kOverviewBlockRows{64, 4096, 262144};

// The scalar series, in the order of OverviewLevel::scalars' columns.
enum class OverviewScalar : uint8_t { loss, lr, loss_scale, grad_norm, step_time };
inline constexpr size_t kOverviewScalars = 5;

// `width` series over a number of blocks, row-major [block x series]. min and
// max are over finite values (NaN where a block has none); nan and inf count
// the rest. A series whose NaN means "not recorded" (layer_act_absmax, written
// every N steps) counts no NaN.
template <typename T>
struct BlockStats {
  size_t width = 0;
  bool nan_is_missing = false;
  std::vector<T> min, max, last;
  std::vector<uint32_t> nan, inf;

  size_t blocks() const { return width == 0 ? 0 : min.size() / width; }
  void add_block();
  // One row's values (width of them) into `block`.
  void add_row(size_t block, const T* values);
  // Block `from` of `other` (the same width), which comes after what `block` holds.
  void fold(size_t block, const BlockStats& other, size_t from);
  // Drops the blocks past the first `blocks`.
  void keep_blocks(size_t blocks);
  void reserve_blocks(size_t blocks);
};

struct OverviewLevel {
  int64_t block_rows = 0;
  // Per block: the steps of its first and last row, its rows (block_rows, but
  // fewer in a run's last, partial block) and how many of them were skipped.
  std::vector<int64_t> first_step, last_step, rows, skipped;
  BlockStats<double> scalars;         // width kOverviewScalars
  BlockStats<float> layer_grad_norm;  // width: the layers (0 when not recorded)
  BlockStats<float> layer_act_absmax;
  size_t blocks() const { return rows.size(); }
};

struct RunOverview {
  std::vector<OverviewLevel> levels;  // one per kOverviewBlockRows, each ending with the run's partial block
  int64_t rows = 0;                   // the rows it covers
  bool built_from_rows = false;       // the file had none: made from its rows here
};

// The run's rows [begin, begin + n) as the writer has them (the per-layer
// tables row-major, empty when not recorded).
struct RowsView {
  size_t n = 0, layers = 0;
  const int64_t* step = nullptr;
  const double* loss = nullptr;
  const double* lr = nullptr;
  const double* loss_scale = nullptr;
  const double* grad_norm = nullptr;
  const double* step_time = nullptr;
  const uint8_t* skipped = nullptr;
  const float* layer_grad_norm = nullptr;  // n x layers, or null
  const float* layer_act_absmax = nullptr;
};

// Turns rows into blocks at every level: the writer feeds it each batch of
// rows it writes and stores the blocks it completes; build_overview feeds it
// a whole file's rows. A row costs one pass over its values; a block costs
// one fold into the next level's open block.
class OverviewBuilder {
 public:
  OverviewBuilder(size_t layers, bool act_absmax);
  void add(const RowsView& rows);
  // A stored block of `level`, complete, taken as written: folded into the
  // next level's open block (the writer's resume, seeding its open blocks).
  void add_stored_block(size_t level, const OverviewLevel& stored, size_t block);
  // The blocks completed at each level since the last call, and forgets them.
  std::vector<OverviewLevel> take_completed();
  // The open (partial) block of each level, with everything finer folded in:
  // what a reader appends after the complete blocks. Empty levels for a run
  // whose rows all fell in complete blocks.
  std::vector<OverviewLevel> open_blocks() const;
  // Brings a reader's `levels` (one per kOverviewBlockRows) up to date: the
  // open blocks this call appended last time are replaced by the blocks
  // completed since and the open blocks now. A reader that follows a run
  // calls it after every batch of rows it adds.
  void publish_into(std::vector<OverviewLevel>& levels);
  // Drops the open blocks (a resumed writer seeds them again).
  void reset();

 private:
  void complete(size_t level);
  std::vector<OverviewLevel> open_, completed_;  // each level's open block (0 or 1 block), and completed ones
  std::vector<size_t> published_open_;           // per level: the open blocks publish_into appended last
};

// An empty level of the right widths.
OverviewLevel empty_overview_level(size_t level, size_t layers, bool act_absmax);
// Appends `src`'s blocks after `dst`'s.
void append_blocks(OverviewLevel& dst, const OverviewLevel& src);
// Drops `level`'s blocks past the first `blocks`.
void keep_blocks(OverviewLevel& level, size_t blocks);
// Rows [begin, end) of rows already read.
RowsView rows_view(const RunData& run, size_t begin, size_t end);

// The overview of rows already read (an older file's, or a test's).
RunOverview build_overview(const RunData& run);

// Reads run.h5's overview (its stored blocks and the rows after the last
// complete finest block), or, for a file that has none, reads its rows and
// builds it, calling `progress(rows done, rows)` as it goes. Throws
// FormatError naming the file for a corrupt, truncated or inconsistent one.
RunOverview read_run_overview(const std::string& path, const std::function<void(int64_t, int64_t)>& progress = nullptr);

}  // namespace nanscope::format
