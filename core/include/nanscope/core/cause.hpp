#pragma once
// The cause of a failed step, decided from evidence alone, in one place for
// both who ask: the guard's --fallback auto (remedy.hpp), which gathers the
// evidence re-run by re-run as the rules ask for it, and nanscope-replay's
// verdict (replay/verdict.hpp), which has gathered all of it. The same
// evidence gives the same cause on either side. docs/replay.md has the table;
// tests/core/cause_test.cpp has a row per rule.
//
// The rules, in the order they are tried:
//   nonfinite_weights   the weights held NaN/Inf as the step began      model_or_data
//   compiled_program    non-finite compiled, finite run eagerly          compiler
//   not_reproduced      every re-run of the same step was finite         transient
//   nonfinite_batch     the batch holds a NaN/Inf (the input's birth)    data
//   no_counted_target   a loss whose mean is over no counted target      data
//   kernel_differs      the born op has other kernels here, and one of   kernel
//                       them makes the step finite
//   fp32_rerun_raised   the re-run with autocast off raised              no verdict
//   finite_in_fp32      finite with autocast off                         precision
//   rows_out_of_range   non-finite in fp32 too, finite without rows      data
//                       whose values lie far outside the batch's
//   trigger_rows        ... finite without ordinary rows: they trigger   model_or_data
//                       an op that is unsafe for some inputs
//   every_row           ... non-finite whichever row is left out         model_or_data
//   rows_not_searched   ... the row search could not run (says why)      model_or_data
// "Non-finite in fp32 too" includes a step that ran in fp32, and a model of
// its own 16-bit weights the guard cannot widen (no fp32 re-run: the rules
// after it say nothing of precision, and the cause's `fp32_unknown` says so).
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "nanscope/format/capture.hpp"
#include "nanscope/format/kernel_trials.hpp"
#include "nanscope/format/vocabulary.hpp"

namespace nanscope {

// How the step went with autocast off.
enum class Fp32Rerun {
  not_run,    // not yet: the rules ask for it
  finite,     // finite
  nonfinite,  // non-finite (or the step ran in fp32)
  raised,     // the re-run raised before any NaN or Inf was born: no evidence
  unknown,    // cannot be run (a model of its own 16-bit weights, in-run)
};

// Which batch rows the step needs to go non-finite.
struct RowSearch {
  enum class State { not_run, ran, cannot_run } state = State::not_run;
  std::vector<int64_t> breaking;      // ran: the rows without which the step is finite
  std::vector<int64_t> out_of_range;  // of those, the rows out of the batch's range (rows_out_of_range)
  std::string why_not;                // cannot_run: why ("the batch has one row")
  // ran: each row was tested replaced by a copy of another (the step draws
  // random numbers, which a removed row would shift), not removed.
  bool replaced = false;
};

struct CauseEvidence {
  std::optional<format::Birth> birth;  // the first birth, if one was seen
  bool batch_nonfinite = false;        // the batch holds a NaN/Inf
  std::vector<std::string> nonfinite_weights;
  // Re-runs at the step's own precision: how many, how many non-finite. A
  // guard's forensic re-run is one of one.
  int repeats = 0, reproduced = 0;
  std::optional<bool> eager_finite;  // a compiled model's step run eagerly; nullopt: not compiled
  // The born op's kernels that can be switched here (kernel_switch.hpp's
  // switchable_kernels), and the step re-run with each of the others:
  // asked for (EvidenceNeeded::kernel_reruns) only where there are some.
  std::optional<format::KernelChoice> kernel_choice;
  std::optional<format::KernelTrials> kernels;
  Fp32Rerun fp32 = Fp32Rerun::not_run;
  RowSearch rows;
  bool grad_norm_rose = false;  // the run's grad norm rose for steps before this one (run.h5)
};

// The rule that decided (the table above).
enum class CauseRule {
  nonfinite_weights,
  compiled_program,
  not_reproduced,
  nonfinite_batch,
  no_counted_target,
  kernel_differs,
  fp32_rerun_raised,
  finite_in_fp32,
  rows_out_of_range,
  trigger_rows,
  every_row,
  rows_not_searched,
};

struct Cause {
  CauseRule rule = CauseRule::not_reproduced;
  // nullopt: no verdict (the fp32 re-run raised, so nothing says whether
  // precision is the cause).
  std::optional<format::Verdict> verdict;
  format::Category category = format::Category::other;
  // rows_out_of_range: those rows; trigger_rows: the rows without which the step is finite.
  std::vector<int64_t> rows;
  // No fp32 re-run could be made: a model_or_data cause may be precision too.
  bool fp32_unknown = false;
};

// Evidence the rules need before they can decide, for a caller that gathers lazily.
enum class EvidenceNeeded { kernel_reruns, fp32_rerun, row_search };

std::variant<Cause, EvidenceNeeded> classify_cause(const CauseEvidence& evidence);

// classify_cause for evidence that is complete: throws std::logic_error if a rule still needs some.
Cause cause_of(const CauseEvidence& evidence);

// How the rows a trigger_rows cause names break the step, after "ordinary
// sample(s) on which": "aten::log (forward) in module 'head' makes inf of
// the output of aten::rsub (log_nonpositive)". The op that made the birth
// op's input is named where the trail shows it (probe/input_producer.hpp).
std::string trigger_text(const format::Birth& birth, const std::vector<format::OpRecord>& trail);

// A row is out of the batch's range when the largest magnitude of its
// floating values is more than this many times the median of the other
// rows' largest magnitudes (docs/replay.md): a glitched reading, a sample
// scaled by mistake. An ordinary row that drives an unsafe op is not.
inline constexpr double kRowOutOfRangeFactor = 1000.0;

// The row search on a step that draws random numbers tests each row by
// putting a copy of another row in its place (RowSearch::replaced): the
// first row that is not `row` and not among `suspects` (the rows the birth
// names: a trigger's copy would keep the step non-finite).
int64_t donor_row(int64_t row, int64_t batch_size, const std::vector<int64_t>& suspects);
// How such a search's finding is worded, in the guard's line and the replay's verdict.
inline constexpr const char* kRowsReplacedText =
    "each row tested by putting a copy of another row in its place: every shape and every random draw stayed as it "
    "was";

}  // namespace nanscope
