#pragma once
// run.h5's /overview on disk (run_overview.hpp): per level a group
// /overview/<block rows> of row-per-block datasets. The writer creates and
// appends them and, on resume, cuts them back and seeds its builder; the
// reader reads them. Layout (docs/format.md):
//   blocks       int64   [n x 4]   first step, last step, rows, skipped rows
//   scalars      float64 [n x 25]  per scalar series: min, max, last, NaNs, Infs
//   layer_grad_norm, layer_act_absmax         float32 [n x 3L]  min, max, last per layer
//   layer_grad_norm_counts, layer_act_absmax_counts  uint32 [n x 2L]  NaNs, Infs per layer
#include <hdf5.h>

#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/run_overview.hpp"
#include "run_columns.hpp"

namespace nanscope::format {

class OverviewColumns {
 public:
  // Creates /overview's groups and datasets: before SWMR writing starts.
  static OverviewColumns create(hid_t file, size_t layers, bool act_absmax, const std::string& path);
  // A file's /overview, opened for appending; nullopt for a file without one
  // (written before format 1.12): it goes on without, and readers build one.
  static std::optional<OverviewColumns> open(hid_t file, const std::string& path);

  void append(const std::vector<OverviewLevel>& completed, const std::string& path);
  // The run's rows were cut back to `rows`: drops the blocks past them and
  // seeds `builder` with the open blocks those rows leave.
  void keep_rows(hsize_t rows, OverviewBuilder& builder, hid_t file, const std::string& path);

 private:
  struct Level {
    Column blocks, scalars, grad, grad_counts, act, act_counts;
  };
  std::vector<Level> levels_;
  size_t layers_ = 0;
  bool act_absmax_ = false;
};

// What a file's overview holds, read: each level's complete blocks that agree
// with the rows the file holds and with the levels below.
struct StoredOverview {
  size_t layers = 0;
  bool act_absmax = false;
  std::vector<hsize_t> blocks;  // per level
};

// The stored blocks' counts, cut to what `rows` rows and the finer levels
// support (a SWMR reader may see one dataset's appends before another's).
// nullopt for a file without /overview.
std::optional<StoredOverview> stored_overview(hid_t file, hsize_t rows, const std::string& path);
// Blocks [from, to) of `level`, in arrays with room for `capacity` blocks
// (a follower's: its run goes on growing, and an array that moves when it
// grows is copied whole).
OverviewLevel read_overview_blocks(hid_t file, const StoredOverview& stored, size_t level, hsize_t from, hsize_t to,
                                   const std::string& path, hsize_t capacity = 0);
// Seeds `builder` with the open blocks of a file whose complete blocks are
// `stored` and whose rows number `rows`: each level's stored blocks past the
// next level's last complete one, then the rows past the last complete block.
void seed_open_blocks(OverviewBuilder& builder, hid_t file, const StoredOverview& stored, hsize_t rows,
                      const std::string& path);
// The rows every step column holds (a SWMR writer extends them one by one):
// the scalar columns and the per-layer tables asked for.
hsize_t committed_rows(hid_t file, bool grad, bool act, const std::string& path);
// Rows [from, to) of /steps, as a RunData of those rows alone.
RunData read_step_rows(hid_t file, hsize_t from, hsize_t to, size_t layers, bool grad, bool act,
                       const std::string& path);

}  // namespace nanscope::format
