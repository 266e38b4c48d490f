#pragma once
// nanscope's words, as types: what run.h5's events are, the phase and kind of
// a birth, the precision a step ran in, replay's verdicts and categories.
// Files and reports spell them as the strings below; every program and the
// viewer goes through to_string and from_string, so each is spelled once.
#include <cstdint>
#include <optional>
#include <string>

namespace nanscope::format {

// /events/kind (docs/format.md).
enum class EventKind {
  skip,              // a non-finite step: the optimizer step was skipped
  scale_backoff,     // fp16: the loss scale went down
  first_birth,       // the forensic re-run's first birth
  snapshot,          // a snapshot was written (text: its path)
  snapshot_failed,   // it could not be (text: why)
  snapshot_skipped,  // not written: the same birth as an earlier one, or the cap reached
  fallback,          // the one-shot fallback to fp32
  nonfinite_ranks,   // data parallel: the ranks whose own check failed ("1", "0,2")
  first_nonfinite,   // the same, at the run's first skip
  dist_error,        // a collective failed (a peer died or timed out)
  warning,           // early warning: a signal heading for a NaN (text: signal, where, value, baseline)
  stop,              // the run stopped: its weights went non-finite and nothing could save it
  rollback,          // the run went back to a saved good state (text: event_text.hpp's rollback_text)
  resume,            // nanscope-train --resume went on from a checkpoint (text: which, and the rows dropped)
  remedy,            // --fallback auto: what the step's diagnosis chose ("data: ...", "fp32-modules: ...")
  save_refused,      // a checkpoint or rollback state was not written: the state was non-finite (text: which tensors)
};

// Where an op ran: in the model's forward or backward, in the global-norm
// computation after backward, or the batch itself (a non-finite input).
enum class Phase { forward, backward, grad_norm, input };

enum class BirthKind { nan, inf };

// The precision a step ran in; its numbers are /steps/amp's.
enum class Precision : uint8_t { fp32 = 0, bf16 = 1, fp16 = 2 };

// nanscope-replay's answer and the arithmetic origin of a birth (docs/playbook.md).
enum class Verdict { precision, model_or_data, data, transient };
enum class Category {
  log_nonpositive,
  sqrt_grad_zero,
  div_by_zero,
  exp_overflow,
  overflow,
  fully_masked_softmax,
  nonfinite_input,
  grad_explosion,
  all_targets_ignored,  // a loss's mean over zero counted targets: 0 / 0
  other,
};

const char* to_string(EventKind kind);
const char* to_string(Phase phase);
const char* to_string(BirthKind kind);
const char* to_string(Precision precision);  // "fp32", "bf16", "fp16"
const char* to_string(Verdict verdict);
const char* to_string(Category category);

// The inverse of to_string: nullopt for anything else (a newer or foreign file).
template <typename Word>
std::optional<Word> from_string(const std::string& text);

}  // namespace nanscope::format
