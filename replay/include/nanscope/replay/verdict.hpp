#pragma once
// Verdicts and categories (docs/replay.md, nanscope-replay), with suggestions drawn from the
// precision-and-stability playbook, docs/playbook.md (P1-P19). The verdict is
// classify_cause's (core/cause.hpp), the rule the guard's remedy follows too.
#include <optional>
#include <string>
#include <vector>

#include "nanscope/core/cause.hpp"
#include "nanscope/format/capture.hpp"
#include "nanscope/probe/birth_category.hpp"

namespace nanscope::replay {

using probe::category_of;  // the birth's arithmetic origin (probe/birth_category.hpp)

// What the search for modules that need fp32 established.
enum class Fp32Search {
  not_run,      // not a precision verdict, or --no-bisect
  found,        // fp32_modules is the smallest set
  none_found,   // no set of modules in fp32 made the step finite (only the whole step did)
  unsupported,  // a TorchScript model whose modules' frames could not be switched: no answer
};

struct VerdictInputs {
  std::optional<format::Birth> birth;   // the first birth at the original precision
  std::vector<format::OpRecord> trail;  // the ops up to it: what made its inputs (input_producer.hpp)
  int reproduced = 0, repeats = 0;      // re-runs at the original precision that went non-finite
  bool fp32_finite = false;
  // The model's own 16-bit weight type ("bfloat16"), "" for wider weights:
  // the fp32 re-run widened them, and no module set in fp32 is searched for.
  std::string own_16bit;
  // Such a model's step under autocast, re-run with its weights widened at
  // that autocast: finite or not; nullopt when not run (autocast off, or the
  // fp32 re-run was not finite).
  std::optional<bool> widened_finite_at_amp;
  Fp32Search fp32_search = Fp32Search::not_run;
  std::vector<std::string> fp32_modules;  // precision bisection's answer, when found
  std::vector<int64_t> samples;           // batch bisection's answer (batch rows)
  // Whether batch bisection ran, and why not when it did not; of `samples`,
  // those out of the batch's range (Batch::rows_out_of_range).
  bool rows_searched = false;
  std::string rows_not_searched;
  std::vector<int64_t> rows_out_of_range;
  // The search replaced each row by a copy of another (the step draws random
  // numbers) instead of removing it.
  bool rows_replaced = false;
  // Each batch row's row in the data set, the snapshot's /batch/rows: -1 where
  // unknown (format/row_text.hpp); its length is the batch size.
  std::vector<int64_t> batch_rows;
  format::Precision precision = format::Precision::unknown;
  // Who ran the loop: the suggestion names options and code as they write
  // them (format/advice_words.hpp); unknown reads as nanscope-train.
  format::Origin origin = format::Origin::unknown;
  std::string grad_norm_trend;  // from run.h5 beside the snapshot, or ""
  // A compiled model (torch.compile): the re-runs above ran its compiled
  // program, and this one ran the step eagerly at the same precision;
  // nullopt for a model that is not compiled.
  std::optional<bool> eager_finite;
  // The module that, compiled alone, makes the step non-finite ("": only the
  // whole model; core/compiled_region.hpp); nullopt when not searched.
  std::optional<std::string> compiled_region;
  // The born op's kernels this machine can switch between, and the step
  // re-run with each of the others (core/kernel_switch.hpp); nullopt where
  // the op has none here, or the step did not go non-finite again.
  std::optional<format::KernelChoice> kernel_choice;
  std::optional<format::KernelTrials> kernels;
  std::string rerun_error;  // an op raised during a re-run (one line), or ""
  // The snapshot's parameters that hold a NaN/Inf: the value was there before
  // the step, and nothing was re-run.
  std::vector<std::string> nonfinite_weights;
  // The run's search for the update that doomed this step: whether it was on
  // (the snapshot's config), and whether it left an answer about this step.
  bool doom_search_on = false, doom_search_answered = false;
};

struct Verdict {
  format::Verdict verdict = format::Verdict::transient;
  format::Category category = format::Category::other;
  std::string suggestion;
};

// The evidence the replay gathered, as the classifier reads it.
CauseEvidence cause_evidence(const VerdictInputs& in);
Verdict decide(const VerdictInputs& in);

// "a, b, c": how reports and suggestions list modules.
std::string comma_list(const std::vector<std::string>& items);

}  // namespace nanscope::replay
