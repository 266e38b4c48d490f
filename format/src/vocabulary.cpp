#include "nanscope/format/vocabulary.hpp"

#include <array>
#include <utility>

namespace nanscope::format {

namespace {

template <typename Word, size_t N>
using Names = std::array<std::pair<Word, const char*>, N>;

constexpr Names<EventKind, 16> kEventKinds{{{EventKind::skip, "skip"},
                                            {EventKind::scale_backoff, "scale_backoff"},
                                            {EventKind::first_birth, "first_birth"},
                                            {EventKind::snapshot, "snapshot"},
                                            {EventKind::snapshot_failed, "snapshot_failed"},
                                            {EventKind::snapshot_skipped, "snapshot_skipped"},
                                            {EventKind::fallback, "fallback"},
                                            {EventKind::nonfinite_ranks, "nonfinite_ranks"},
                                            {EventKind::first_nonfinite, "first_nonfinite"},
                                            {EventKind::dist_error, "dist_error"},
                                            {EventKind::warning, "warning"},
                                            {EventKind::stop, "stop"},
                                            {EventKind::rollback, "rollback"},
                                            {EventKind::resume, "resume"},
                                            {EventKind::remedy, "remedy"},
                                            {EventKind::save_refused, "save_refused"}}};
constexpr Names<Phase, 4> kPhases{{{Phase::forward, "forward"},
                                   {Phase::backward, "backward"},
                                   {Phase::grad_norm, "grad_norm"},
                                   {Phase::input, "input"}}};
constexpr Names<BirthKind, 2> kBirthKinds{{{BirthKind::nan, "nan"}, {BirthKind::inf, "inf"}}};
constexpr Names<Precision, 3> kPrecisions{
    {{Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}}};
constexpr Names<Verdict, 4> kVerdicts{{{Verdict::precision, "precision"},
                                       {Verdict::model_or_data, "model_or_data"},
                                       {Verdict::data, "data"},
                                       {Verdict::transient, "transient"}}};
constexpr Names<Category, 10> kCategories{{{Category::log_nonpositive, "log_nonpositive"},
                                           {Category::sqrt_grad_zero, "sqrt_grad_zero"},
                                           {Category::div_by_zero, "div_by_zero"},
                                           {Category::exp_overflow, "exp_overflow"},
                                           {Category::overflow, "overflow"},
                                           {Category::fully_masked_softmax, "fully_masked_softmax"},
                                           {Category::nonfinite_input, "nonfinite_input"},
                                           {Category::grad_explosion, "grad_explosion"},
                                           {Category::all_targets_ignored, "all_targets_ignored"},
                                           {Category::other, "other"}}};

template <typename Word, size_t N>
const char* name_in(const Names<Word, N>& names, Word word) {
  for (const auto& [w, name] : names)
    if (w == word) return name;
  return "?";
}

template <typename Word, size_t N>
std::optional<Word> word_in(const Names<Word, N>& names, const std::string& text) {
  for (const auto& [w, name] : names)
    if (text == name) return w;
  return std::nullopt;
}

}  // namespace

const char* to_string(EventKind kind) { return name_in(kEventKinds, kind); }
const char* to_string(Phase phase) { return name_in(kPhases, phase); }
const char* to_string(BirthKind kind) { return name_in(kBirthKinds, kind); }
const char* to_string(Precision precision) { return name_in(kPrecisions, precision); }
const char* to_string(Verdict verdict) { return name_in(kVerdicts, verdict); }
const char* to_string(Category category) { return name_in(kCategories, category); }

template <>
std::optional<EventKind> from_string<EventKind>(const std::string& text) {
  return word_in(kEventKinds, text);
}
template <>
std::optional<Phase> from_string<Phase>(const std::string& text) {
  return word_in(kPhases, text);
}
template <>
std::optional<BirthKind> from_string<BirthKind>(const std::string& text) {
  return word_in(kBirthKinds, text);
}
template <>
std::optional<Precision> from_string<Precision>(const std::string& text) {
  return word_in(kPrecisions, text);
}
template <>
std::optional<Verdict> from_string<Verdict>(const std::string& text) {
  return word_in(kVerdicts, text);
}
template <>
std::optional<Category> from_string<Category>(const std::string& text) {
  return word_in(kCategories, text);
}

}  // namespace nanscope::format
