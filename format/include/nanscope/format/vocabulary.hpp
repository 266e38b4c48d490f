#pragma once
// nanscope's words, as types: what run.h5's events are, the phase and kind of
// a birth, the precision a step ran in, replay's verdicts and categories.
//
// Each list below is the one place its words are written: an X-macro of
// X(enumerator, "spelling") that generates the enum, its spellings and its
// count (c10's ScalarType.h does the same), so a word cannot drift from its
// spelling and a new one is added in one line. Records hold the enums; the
// strings appear only where files and command lines are read and written,
// through to_string and from_string. Every enum ends in `unknown`: what a
// reader makes of a word from a newer or foreign file.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace nanscope::format {

// /events/kind (docs/format.md).
#define NANSCOPE_EVENT_KINDS(X)                                                                                   \
  X(skip, "skip")                         /* a step that did not count: the optimizer step was skipped */         \
  X(scale_backoff, "scale_backoff")       /* fp16: the loss scale went down */                                    \
  X(first_birth, "first_birth")           /* the forensic re-run's first birth */                                 \
  X(snapshot, "snapshot")                 /* a snapshot was written (text: its path) */                           \
  X(snapshot_failed, "snapshot_failed")   /* it could not be (text: why) */                                       \
  X(snapshot_skipped, "snapshot_skipped") /* not written: the same birth as an earlier one, or the cap reached */ \
  X(fallback, "fallback")                 /* the one-shot fallback of the whole model to fp32 */                  \
  X(nonfinite_ranks, "nonfinite_ranks")   /* data parallel: the ranks whose own check failed ("1", "0,2") */      \
  X(first_nonfinite, "first_nonfinite")   /* the same, at the run's first skip */                                 \
  X(dist_error, "dist_error")             /* a collective failed (a peer died or timed out) */                    \
  X(warning, "warning")                   /* early warning: a signal heading for a NaN */                         \
  X(stop, "stop")                         /* the run stopped: nothing could save it */                            \
  X(rollback, "rollback")                 /* the run went back to a saved good state (event_text.hpp) */          \
  X(resume, "resume")                     /* --resume went on from a checkpoint */                                \
  X(remedy, "remedy")                     /* --fallback auto: what the step's diagnosis chose */                  \
  X(save_refused, "save_refused")         /* a checkpoint or rollback state not written: the state was sick */    \
  X(doom, "doom")                         /* at the step whose update doomed a later one (docs/recovery.md) */    \
  X(empty_loss, "empty_loss")             /* micro-batches whose NaN loss had zero gradients, left out */

// Where an op ran: in the model's forward or backward, in the global-norm
// computation after backward, or the batch itself (a non-finite input).
#define NANSCOPE_PHASES(X) X(forward, "forward") X(backward, "backward") X(grad_norm, "grad_norm") X(input, "input")

// What ran an op, beyond its phase: the op itself (an aten op, or the
// derivative of one in its autograd node), a gradient hook run with a
// backward node (tensor.register_hook, a node's pre- or post-hook), or a
// forward op that activation checkpointing recomputed during the backward
// (and a backward op of a node that recomputation made).
#define NANSCOPE_OP_SITES(X) X(op, "op") X(gradient_hook, "gradient_hook") X(recomputation, "recomputation")

// Who wrote a run or snapshot: the wording of advice follows it (a flag for
// nanscope-train, an option and C++ for the library, Python for the module).
#define NANSCOPE_ORIGINS(X) X(nanscope_train, "nanscope-train") X(cpp, "cpp") X(python, "python")

#define NANSCOPE_BIRTH_KINDS(X) X(nan, "nan") X(inf, "inf")

// The precision a step ran in; the order is /steps/amp's numbers (0, 1, 2).
#define NANSCOPE_PRECISIONS(X) X(fp32, "fp32") X(bf16, "bf16") X(fp16, "fp16")

// nanscope-replay's answer and the arithmetic origin of a birth (docs/playbook.md).
#define NANSCOPE_VERDICTS(X)                                                                          \
  X(precision, "precision")                                                                           \
  X(model_or_data, "model_or_data")                                                                   \
  X(data, "data")                                                                                     \
  X(transient, "transient")                                                                           \
  X(compiler, "compiler") /* non-finite compiled, finite run eagerly: the compiled program's fault */ \
  X(kernel, "kernel")     /* non-finite with the kernel the step ran, finite with another (kernel_trials.hpp) */
#define NANSCOPE_CATEGORIES(X)                                                                                   \
  X(log_nonpositive, "log_nonpositive")                                                                          \
  X(sqrt_grad_zero, "sqrt_grad_zero")                                                                            \
  X(div_by_zero, "div_by_zero")                                                                                  \
  X(exp_overflow, "exp_overflow")                                                                                \
  X(overflow, "overflow")                                                                                        \
  X(fully_masked_softmax, "fully_masked_softmax")                                                                \
  X(nonfinite_input, "nonfinite_input")                                                                          \
  X(grad_explosion, "grad_explosion")                                                                            \
  X(all_targets_ignored, "all_targets_ignored") /* a loss's mean over zero counted targets: 0 / 0 */             \
  X(compiled_program, "compiled_program")       /* the compiler verdict's: no op of the model's math */          \
  X(nonfinite_weights, "nonfinite_weights")     /* the weights held it as the step began: an earlier update's */ \
  X(other, "other")

#define NANSCOPE_WORD_ENUMERATOR(name, spelling) name,
#define NANSCOPE_WORD_SPELLING(name, spelling) spelling,
#define NANSCOPE_WORD_COUNT(name, spelling) +1

// Words<T>::count and Words<T>::spellings (in enum order) for each word type.
template <typename Word>
struct Words;

// The spelling of a word; "unknown" for unknown.
template <typename Word>
constexpr const char* spelling_of(Word word) {
  const size_t i = static_cast<size_t>(word);
  return i < Words<Word>::count ? Words<Word>::spellings[i] : "unknown";
}

// One enum, its spellings and its to_string per list; the `unknown` after the
// last word is what from_string_or_unknown gives a word it does not know.
// to_string is a plain function per type (not a template), so it never
// competes with other libraries' generic to_string (CLI11's) for these enums.
// Other components declare their own lists the same way, from namespace
// nanscope, with NANSCOPE_DECLARE_WORDS_IN(format::Words, Type, LIST).
#define NANSCOPE_DECLARE_WORDS_IN(WORDS, Type, LIST)                                           \
  enum class Type : uint8_t { LIST(NANSCOPE_WORD_ENUMERATOR) unknown };                        \
  template <>                                                                                  \
  struct WORDS<Type> {                                                                         \
    static constexpr size_t count = 0 LIST(NANSCOPE_WORD_COUNT);                               \
    static constexpr std::array<const char*, count> spellings{{LIST(NANSCOPE_WORD_SPELLING)}}; \
  };                                                                                           \
  constexpr const char* to_string(Type word) { return ::nanscope::format::spelling_of(word); }
#define NANSCOPE_DECLARE_WORDS(Type, LIST) NANSCOPE_DECLARE_WORDS_IN(Words, Type, LIST)

NANSCOPE_DECLARE_WORDS(EventKind, NANSCOPE_EVENT_KINDS)
NANSCOPE_DECLARE_WORDS(Phase, NANSCOPE_PHASES)
NANSCOPE_DECLARE_WORDS(OpSite, NANSCOPE_OP_SITES)
NANSCOPE_DECLARE_WORDS(BirthKind, NANSCOPE_BIRTH_KINDS)
NANSCOPE_DECLARE_WORDS(Precision, NANSCOPE_PRECISIONS)
NANSCOPE_DECLARE_WORDS(Verdict, NANSCOPE_VERDICTS)
NANSCOPE_DECLARE_WORDS(Category, NANSCOPE_CATEGORIES)
NANSCOPE_DECLARE_WORDS(Origin, NANSCOPE_ORIGINS)

// The inverse of to_string: nullopt for anything else (a newer or foreign file, a typo).
template <typename Word>
std::optional<Word> from_string(const std::string& text) {
  for (size_t i = 0; i < Words<Word>::count; ++i)
    if (text == Words<Word>::spellings[i]) return static_cast<Word>(i);
  return std::nullopt;
}

// Readers of files: a word from a newer or foreign writer is `unknown`, not an error.
template <typename Word>
Word from_string_or_unknown(const std::string& text) {
  return from_string<Word>(text).value_or(Word::unknown);
}

// The largest finite value of each precision: fp16's 65504, bf16's and
// fp32's 3.4e38 (bf16 keeps fp32's exponent). The headroom warnings, the
// viewer's reference lines and the verdict's range checks read it here.
constexpr double largest_finite(Precision precision) {
  switch (precision) {
    case Precision::fp16: return 65504.0;
    case Precision::bf16: return 3.3895313892515355e38;
    case Precision::fp32:
    case Precision::unknown: break;
  }
  return 3.4028234663852886e38;
}

// What a step at `precision` computes in, as the guard's lines, replay's
// report and the viewer name it: the precision, except that with autocast off
// (fp32) a model of its own 16-bit weights computes in them (`own_16bit`:
// "bfloat16", "float16"; "" for wider weights).
inline std::string step_precision_name(Precision precision, const std::string& own_16bit) {
  return precision == Precision::fp32 && !own_16bit.empty() ? own_16bit : to_string(precision);
}

}  // namespace nanscope::format
