#pragma once
// run.h5: one row per training step plus events and the run's config
// (schema: docs/format.md). Written through SWMR so a reader can follow a live
// run and a killed run leaves every flushed row readable.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nanscope/format/vocabulary.hpp"

namespace nanscope::format {

struct StepRow {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;
  double grad_norm = 0;  // global, after unscale
  bool skipped = false;
  Precision amp = Precision::fp32;      // /steps/amp: the precision the step ran in
  double step_time = 0;                 // seconds, wall
  std::vector<float> layer_grad_norm;   // one per layer, or empty when not recorded
  std::vector<float> layer_act_absmax;  // one per layer, or empty when not recorded
};

struct RunEvent {
  int64_t step = 0;
  EventKind kind = EventKind::unknown;  // unknown: a word from a newer or foreign file
  std::string text;                     // cut at 240 characters
};

// The text of the nonfinite_ranks and first_nonfinite events, written and read here only: "1", "0,2".
std::string rank_list_text(const std::vector<int>& ranks);
// "1", "0,2", " 2, 0 " -> the ranks, ascending and unique. Anything else (empty,
// a stray comma, a sign, a letter, a rank not below `world_size` when that is
// > 0, a number too large for an int) -> nullopt: a garbled list is unknown,
// never a guess.
std::optional<std::vector<int>> parse_rank_list(const std::string& text, int world_size);

struct RunHeader {
  std::vector<std::string> layer_names;  // empty: no per-layer datasets
  bool record_act_absmax = false;
  std::map<std::string, std::string> config;
  Origin origin = Origin::unknown;  // who runs the loop: nanscope-train, the C++ library, Python
};

// Appends rows in memory and writes them in batches: every `flush_every` rows,
// at the first row appended 2 s or more after the oldest unwritten one, on
// flush(), and on destruction. Each batch is flushed to disk, so a reader (or
// a post-mortem after SIGKILL) sees every batch written before: a kill loses
// at most flush_every - 1 rows, all appended in the 2 s before the last one.
class RunWriter {
 public:
  static constexpr std::chrono::seconds kMaxRowAge{2};
  // Each batch's flush costs about half a millisecond: at 64 rows a fast
  // step pays under 10 us for its row, and 2 s still bound what a kill loses.
  static constexpr size_t kRowsPerBatch = 64;
  RunWriter(const std::string& path, const RunHeader& header, size_t flush_every = kRowsPerBatch);
  // Goes on writing an existing run file (nanscope-train --resume): the rows
  // and events after `keep_through_step` are dropped (the resumed run redoes
  // those steps), and the mark a killed writer left is cleared first.
  static std::unique_ptr<RunWriter> resume(const std::string& path, int64_t keep_through_step,
                                           size_t flush_every = kRowsPerBatch);
  ~RunWriter();
  RunWriter(const RunWriter&) = delete;
  RunWriter& operator=(const RunWriter&) = delete;

  void append(const StepRow& row);
  void event(const RunEvent& event);
  void event(int64_t step, EventKind kind, const std::string& text) { event(RunEvent{step, kind, text}); }
  void flush();
  const std::string& path() const;

 private:
  struct Impl;
  explicit RunWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A writer killed mid-run (SIGKILL, out of memory) leaves its file marked
// "open for writing": nanscope's readers open it (they read with SWMR), but
// readers without SWMR (plain h5py.File(path), h5dump) refuse it. This clears
// the mark, as HDF5's `h5clear -s` does. Returns false for a file that had no
// mark (closed properly); throws FormatError for one that cannot be opened.
bool clear_writer_mark(const std::string& path);

// Moves an earlier run's file out of a new run's way, to the first free
// "<stem>.N.h5" beside it (run.h5 -> run.1.h5), and returns that path: a new
// run never overwrites the record of an earlier one.
std::string keep_aside(const std::string& path);
// Whether the file carries that mark: true while a writer holds it open, and
// after one was killed (until the mark is cleared); false once its writer
// closed it. A follower of a live run asks this to know the run has ended.
// Read from the superblock's bytes, not through HDF5, so a process that holds
// the file open for reading (RunFollower) gets the writer's current word.
// Throws FormatError naming the file when it cannot be read or is not HDF5.
bool has_writer_mark(const std::string& path);
// The mark of a writer that is gone: when the file names its writer (pid and
// host, from 1.8), that process ran on this host and no longer exists, the
// mark is cleared, so plain HDF5 readers (h5py.File(path), h5dump) open the
// file as nanscope's readers do. Returns whether it was cleared; a live
// writer's file, one from another host or from before 1.8 is left as it is.
// nanscope-report and nanscope-view call it on each run file they open.
bool clear_mark_if_writer_gone(const std::string& path);

// A whole run file read into flat arrays (row-major [step x layer] for the
// per-layer tables), the shape the viewer and the tests want.
struct RunData {
  std::string path;
  std::string format_version;
  Origin origin = Origin::unknown;  // unknown in files from before format 1.2
  std::map<std::string, std::string> config;
  std::vector<std::string> layer_names;
  std::vector<int64_t> step;
  std::vector<double> loss, lr, loss_scale, grad_norm, step_time;
  std::vector<uint8_t> skipped, amp;
  std::vector<float> layer_grad_norm;   // step x layer, empty when not recorded
  std::vector<float> layer_act_absmax;  // step x layer, empty when not recorded
  std::vector<RunEvent> events;
  size_t rows() const { return step.size(); }
};

// Whether a reader reads the per-layer tables (steps x layers: most of a long
// run's bytes) or only the scalar columns and events (nanscope-report, which
// reports no layer, opens a million-step run in a fraction of the time).
enum class LayerTables : uint8_t { read, skip };

// Reads a run file; throws FormatError naming the file on any problem. Works on
// a file that is still being written or whose writer was killed.
RunData read_run(const std::string& path, LayerTables layers = LayerTables::read);

// Follows a run file that may still be written: keeps it open for SWMR reading
// and, on refresh(), reads only the rows and events committed since the last
// call (the viewer's live view). Throws FormatError like read_run.
class RunFollower {
 public:
  // Reads every row committed so far (without the layer tables: skip).
  explicit RunFollower(const std::string& path, LayerTables layers = LayerTables::read);
  ~RunFollower();
  RunFollower(const RunFollower&) = delete;
  RunFollower& operator=(const RunFollower&) = delete;

  // Appends newly committed rows to data(); returns how many. Events are
  // re-read when their count changed.
  size_t refresh();
  const RunData& data() const;
  RunData take() &&;  // hands the data over; the follower is done

 private:
  void open(const std::string& path, LayerTables layer_tables);  // under the rehearsal
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nanscope::format
