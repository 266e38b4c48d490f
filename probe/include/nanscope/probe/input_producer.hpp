#pragma once
// Which op made a birth op's input, read from the capture's trail: a log
// whose input came out of a softmax is log(softmax(x)), whose fix is
// log_softmax; a log of a standard deviation (a blank image's, exactly 0) is
// not, and wants its input clamped. Advice has to know which it is.
//
// The trail holds no data-flow links, only each op's output statistics, so
// the producer is the latest op before the birth whose output holds the
// input's values: as many elements, the same non-finite counts, the same min
// and max (both computed from the same tensor, so equal to the bit). A cast
// or copy found that way (autocast's to/_to_copy) is passed through to the op
// it copied, whose values match it within a narrower type's rounding. Nothing
// is found when the producer fell out of the trail (its last 32 ops) or was
// changed in place by a later op (trail statistics are taken when the capture
// ends), and then no advice may assume one.
#include <cstddef>
#include <optional>
#include <vector>

#include "nanscope/format/capture.hpp"

namespace nanscope::probe {

std::optional<format::OpRecord> input_producer(const format::Birth& birth, const std::vector<format::OpRecord>& trail,
                                               size_t input);

// The op before `made` in the trail whose output x, taken to scale * x +
// shift, holds `made`'s output (the same count; its min and max mapped to
// `made`'s within a narrower type's rounding): what `1 - sigmoid(z)` (scale
// -1, shift 1) or `exp(x) + 1` (scale 1, shift 1) was made from. nullopt
// where the trail does not show it.
std::optional<format::OpRecord> affine_source(const format::OpRecord& made, const std::vector<format::OpRecord>& trail,
                                              double scale, double shift);

}  // namespace nanscope::probe
