#pragma once
// The samples a run leaves out: each data set row whose sample a failed
// step's diagnosis blamed (a `data` verdict: the batch held the NaN/Inf, or
// the row's values lay far outside the batch's), kept in the run directory as
// poisoned_samples.jsonl, one JSON object per line:
//   {"row": 363, "step": 40, "rank": 0, "birth": "...", "why": "..."}
// A person reads it, jq or Python's json reads it line by line; deleting a
// line restores that sample, deleting the file clears the list. Readers
// ignore keys they do not know, so a line may carry a note of one's own.
//
// An epoch leaves out the rows listed two steps or more before it starts
// (rows_left_out_at): by then every rank's line is on disk, since every rank
// has passed the collectives of the step between. So every rank leaves out
// the same rows, and a resumed run the same as the run it resumes.
#include <cstdint>
#include <string>
#include <vector>

namespace nanscope::format {

inline constexpr const char* kPoisonListFile = "poisoned_samples.jsonl";

struct PoisonedSample {
  int64_t row = -1;   // in the data set
  int64_t step = -1;  // the step whose diagnosis listed it
  int rank = -1;      // the process that met it (-1: one process)
  std::string birth;  // the step's first birth, as the run's line says it
  std::string why;    // the diagnosis, as the remedy event says it
};

std::string poison_list_path(const std::string& run_dir);

// Every sample listed (a file that does not exist: none). Throws FormatError
// naming the file and the line for a line that is not such an object (a
// hand edit gone wrong), rather than leaving out the wrong samples.
std::vector<PoisonedSample> read_poison_list(const std::string& path);

// Appends `sample` as one line, in one write: lines that several ranks append
// never interleave. Throws WriteError.
void append_poisoned_sample(const std::string& path, const PoisonedSample& sample);

// A new run started in a directory that holds a list (an earlier run's, or
// one a person put there) leaves its samples out from its first step: their
// steps become kListedBeforeTheRun, rewritten in place (a new file renamed
// over the old). Returns how many are listed. Throws FormatError/WriteError.
inline constexpr int64_t kListedBeforeTheRun = -2;
size_t start_poison_list_anew(const std::string& path);

// The rows an epoch that starts at `step` leaves out: those listed at
// step - 2 or before. Ascending, each once.
std::vector<int64_t> rows_left_out_at(const std::vector<PoisonedSample>& list, int64_t step);

}  // namespace nanscope::format
